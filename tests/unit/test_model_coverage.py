"""docs/models.md's coverage table is what radixlm/model_coverage_doc.py generates from the
registries (and the committed llama.cpp converter list), and an architecture radixlm does not serve
is refused in one line naming the closest one it does."""

import textwrap

import pytest

from radixlm import model_coverage_doc as coverage
from radixlm.model.registry import closest_architecture, resolve_architecture


def test_the_table_in_the_docs_is_what_the_registries_generate():
    table = coverage.generate()
    assert coverage.section(coverage.DOC.read_text()) == table, (
        "docs/models.md's coverage table is stale: run `python -m radixlm.model_coverage_doc"
        " --write`"
    )
    # a few rows the registries decide, whatever else is added
    row = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| `")}
    assert row["| `LlamaForCausalLM`"].startswith("| `LlamaForCausalLM` | yes | `llama` | no |")
    assert "| MLA latent |" in row["| `DeepseekV3ForCausalLM`"]
    assert "| recurrent state + MLA latent |" in row["| `KimiLinearForCausalLM`"]
    assert (
        "| yes | recurrent state + full attention |" in row["| `Qwen3_5ForConditionalGeneration`"]
    )
    assert "| sliding window + full attention |" in row["| `Olmo3ForCausalLM`"]
    assert "| none (an encoder) |" in row["| `BertForSequenceClassification`"]


def test_writing_the_table_twice_changes_nothing():
    doc = "# Models\n\ntext\n"
    once = coverage.splice(doc, coverage.BEGIN + "\nold\n" + coverage.END)
    assert (
        once.startswith(doc) and coverage.section(once) == coverage.BEGIN + "\nold\n" + coverage.END
    )
    twice = coverage.splice(once, coverage.BEGIN + "\nnew\n" + coverage.END)
    assert twice == once.replace("old", "new")
    assert coverage.splice(twice, coverage.section(twice)) == twice


def test_the_converter_is_read_with_ast(tmp_path):
    """`@ModelBase.register` names, the GGUF arch of `model_arch` (inherited too), projectors."""
    (tmp_path / "conversion").mkdir()
    (tmp_path / "gguf-py" / "gguf").mkdir(parents=True)
    (tmp_path / "gguf-py" / "gguf" / "constants.py").write_text(
        textwrap.dedent("""\
            MODEL_ARCH_NAMES: dict[MODEL_ARCH, str] = {
                MODEL_ARCH.MMPROJ: "clip",
                MODEL_ARCH.LLAMA: "llama",
                MODEL_ARCH.GEMMA3: "gemma3",
            }
        """)
    )
    converter = tmp_path / "convert_hf_to_gguf.py"
    converter.write_text("import this_module_is_never_imported\n")
    (tmp_path / "conversion" / "models.py").write_text(
        textwrap.dedent("""\
            @ModelBase.register("LlamaForCausalLM", "modeling_x.XForCausalLM")
            class LlamaModel(TextModel):
                model_arch = gguf.MODEL_ARCH.LLAMA

            @ModelBase.register("MistralForCausalLM")
            class MistralModel(LlamaModel):
                pass

            @ModelBase.register("Gemma3ForConditionalGeneration")
            class Gemma3Model(TextModel):
                model_arch = gguf.MODEL_ARCH.GEMMA3

            @ModelBase.register("Gemma3ForConditionalGeneration", "LlavaForConditionalGeneration")
            class Gemma3VisionModel(MmprojModel):
                model_arch = gguf.MODEL_ARCH.MMPROJ
        """)
    )
    archs = coverage.read_converter(converter)
    C = coverage.ConverterArch
    assert archs == {
        "Gemma3ForConditionalGeneration": C("gemma3", True),
        "LlamaForCausalLM": C("llama", False),
        "LlavaForConditionalGeneration": C(None, True),
        "MistralForCausalLM": C("llama", False),
    }
    tsv = tmp_path / "archs.tsv"
    tsv.write_text(coverage.write_converter_archs(archs, "llama.cpp/here"))
    assert coverage.load_converter_archs(tsv) == (archs, "llama.cpp/here")


@pytest.mark.parametrize(
    ("arch", "closest"),
    [
        ("Glm4vForConditionalGeneration", "Glm4MoeForCausalLM"),  # the family's prefix
        ("Mistral3ForConditionalGeneration", "MistralForCausalLM"),
        ("Gemma3nForConditionalGeneration", "Gemma3ForCausalLM"),
        # the same prefix: the most alike name (an image model for an image model)
        ("Qwen3VLForConditionalGeneration", "Qwen3_5ForConditionalGeneration"),
        ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM"),
        ("MambaForCausalLM", "GraniteMoeHybridForCausalLM"),  # a relative the name does not show
    ],
)
def test_the_closest_architecture(arch, closest):
    served = [
        "DeepseekV3ForCausalLM", "Gemma3ForCausalLM", "Glm4MoeForCausalLM",
        "GraniteMoeHybridForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
        "Qwen3ForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM",
    ]  # fmt: skip
    assert closest_architecture(arch, served) == closest


def test_an_unsupported_architecture_is_one_line_naming_the_closest():
    with pytest.raises(ValueError) as refused:
        resolve_architecture(["GlmOcrForConditionalGeneration"])
    message = str(refused.value)
    assert "\n" not in message and len(message) < 200
    assert message.startswith("unsupported model architecture GlmOcrForConditionalGeneration; the")
    assert " the closest radixlm serves: Glm4" in message
    assert message.endswith("(full list: `radixlm models` or docs/models.md#coverage)")
    with pytest.raises(ValueError, match="names no architecture"):
        resolve_architecture(None)


def test_radixlm_models_lists_every_architecture_with_its_gguf_ones(capsys):
    from radixlm.cli import main
    from radixlm.model.registry import supported_architectures

    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == supported_architectures()
    by_arch = {line.split()[0]: line.split()[1:] for line in lines}
    assert by_arch["LlamaForCausalLM"] == ["gguf:llama"]
    assert {"gguf:llama", "gguf:mistral3"} <= set(by_arch["MistralForCausalLM"])
    assert "DeepseekV3ForCausalLM gguf:deepseek2" in lines
    assert "LlavaForConditionalGeneration" in lines  # HF only
