"""`radixlm train-eagle`: train an EAGLE head for a served model, on this machine, from the model's
own answers (self-distillation), and write it in the published layout (config.json +
model.safetensors, architectures LlamaForCausalLMEagle: SGLang loads it too) with a token map.

1. Data (eagle_data.py): the target answers chat prompts (--prompts FILE, one per line, or the
   package's templates x subjects, eagle_prompts.py) through its chat template, greedy by default;
   its final hidden states along the answers are kept from those same forwards. Saved to
   OUT/data.pt, so --resume never regenerates.
2. The token map: the --hot-vocab most frequent tokens of the answers (OUT/token_map.pt, for
   --speculative-token-map): the head ranks these only, a fraction of the LM head's cost per step.
3. Training, EAGLE's loss: at position t the head reads the token at t + 1 and the target's hidden
   state at t (plus uniform noise, as EAGLE) and predicts the hidden state at t + 1: smooth L1 to
   it, plus 0.1 x the cross-entropy of the target's next-token distribution (over the token map's
   tokens) through the target's own LM head. AdamW, gradient clipping, linear warm-up.
   OUT/checkpoint.pt holds the head, the optimizer and the step every --save-every steps (and the
   published files are rewritten then), so --resume continues where it stopped.
The head starts as the identity on the target's hidden state (fc = [0 | I], the layer's output
projections zero): it first predicts "the same state again", and learns the step from there.

The same loop fits a model's own multi-token-prediction head (Trainer(..., head=MtpHead), its
fit_parameters: eh_proj and the norms around the family's layer) to the model's answers; its
output is already the normed state the target's LM head reads, compared as EAGLE's is.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from radixlm.speculative.eagle_checkpoint import save_eagle_head, save_token_map
from radixlm.speculative.eagle_data import Sample, generate_samples
from radixlm.speculative.eagle_head import EagleHead, EagleHeadConfig, causal_attend
from radixlm.speculative.eagle_prompts import default_prompts
from radixlm.speculative.eagle_vocab import lm_head_rows

logger = logging.getLogger(__name__)

P_WEIGHT = 0.1  # EAGLE's weight of the token loss against the hidden-state regression
MAX_PROMPT_TOKENS = 1024  # longer prompts (from --prompts) are left out
NOISE = 0.2  # EAGLE's uniform noise on the input hidden states: [-NOISE/2, NOISE/2] x ...


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model-path",
        default=None,
        help="the target: HF directory or GGUF file (default: the default model)",
    )
    p.add_argument(
        "--output", required=True, help="directory for the head, its token map, data and checkpoint"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUTPUT/checkpoint.pt (and OUTPUT/data.pt)",
    )
    p.add_argument(
        "--prompts", default=None, help="a text file, one prompt per line (default: the package's)"
    )
    p.add_argument("--num-prompts", type=int, default=400, help="prompts answered for the data")
    p.add_argument("--max-new-tokens", type=int, default=256, help="longest answer")
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="of the answers (0: greedy, as served by default)",
    )
    p.add_argument("--batch-size", type=int, default=16, help="prompts answered at once")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument(
        "--batch-tokens", type=int, default=2048, help="training positions per optimizer step"
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--hot-vocab",
        type=int,
        default=8192,
        help="tokens in the token map (0: the whole vocabulary)",
    )
    p.add_argument("--save-every", type=int, default=50, help="optimizer steps between checkpoints")
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="stop after this many optimizer steps (a smoke run)",
    )
    p.add_argument(
        "--mtp",
        action="store_true",
        help="fit the model's own multi-token-prediction head instead (eh_proj and its norms;"
        " written to OUTPUT/mtp_fit.safetensors under the checkpoint's names)",
    )
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)


@dataclass
class TrainState:
    step: int = 0
    total_steps: int = 0
    seconds: float = 0.0  # training time so far (data generation apart)
    data_seconds: float = 0.0
    loss: float = float("nan")
    accuracy: float = float(
        "nan"
    )  # held-out: the head's top token equals the target's, per position


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s] %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    os.makedirs(args.output, exist_ok=True)
    ckpt_file = os.path.join(args.output, "checkpoint.pt")
    if os.path.exists(ckpt_file) and not args.resume:
        raise ValueError(
            f"--output {args.output!r} holds a checkpoint: pass --resume to continue it, or another"
            " directory"
        )
    if args.resume and not os.path.exists(ckpt_file):
        raise ValueError(f"--resume: no checkpoint in {args.output!r}")
    runner = _target_runner(args)
    samples, seconds = _data(args, runner)
    head = None
    if getattr(args, "mtp", False):
        from radixlm.speculative.mtp_checkpoint import load_mtp_head

        head = load_mtp_head(runner, "nextn")
    trainer = Trainer(args, runner, samples, head)
    trainer.state.data_seconds = seconds
    if args.resume:
        trainer.load(ckpt_file)
    trainer.run()
    print(json.dumps(asdict(trainer.state)))
    return 0


def _target_runner(args):
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig

    tokens = args.batch_size * (args.max_new_tokens + MAX_PROMPT_TOKENS)
    return ModelRunner(
        ModelRunnerConfig(
            model_path=args.model_path,
            max_total_tokens=tokens,
            max_running_requests=args.batch_size,
            num_threads=args.num_threads,
            random_seed=args.seed,
        )
    )


def _data(args, runner) -> tuple[list[Sample], float]:
    file = os.path.join(args.output, "data.pt")
    if os.path.exists(file):
        saved = torch.load(file, weights_only=False)
        logger.info("train-eagle: %d answers from %s", len(saved["samples"]), file)
        return saved["samples"], saved["seconds"]
    from tqdm import tqdm

    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(runner.loaded.tokenizer_path)
    if args.prompts:
        with open(args.prompts, encoding="utf-8") as f:
            texts = [line.strip() for line in f if line.strip()][: args.num_prompts]
    else:
        texts = default_prompts(args.num_prompts, args.seed)
    if not texts:
        raise ValueError(f"--prompts {args.prompts!r} holds no prompt")
    template = runner.loaded.chat_template
    ids = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": t}],
                tokenize=False,
                add_generation_prompt=True,
                chat_template=template,
            )
            if template
            else t
        )
        for t in texts
    ]
    long = sum(len(i) > MAX_PROMPT_TOKENS for i in ids)
    if long:
        logger.warning(
            "train-eagle: %d prompts longer than %d tokens left out", long, MAX_PROMPT_TOKENS
        )
        ids = [i for i in ids if len(i) <= MAX_PROMPT_TOKENS]
    t0 = time.perf_counter()
    with tqdm(total=len(ids), desc="answering prompts", unit="prompt") as bar:
        samples = generate_samples(
            runner,
            ids,
            args.max_new_tokens,
            args.temperature,
            args.batch_size,
            runner.loaded.eos_token_ids,
            args.seed,
            bar.update,
        )
    seconds = time.perf_counter() - t0
    torch.save({"samples": samples, "seconds": seconds}, file)
    return samples, seconds


def _answer_rows(s: Sample) -> int:
    """Positions whose loss counts (Trainer._sample_loss)."""
    return max(len(s.tokens) - 2 - max(s.prompt_len - 2, 0), 0)


class Trainer:
    def __init__(self, args, runner, samples: list[Sample], head: torch.nn.Module | None = None):
        """head: an MtpHead to fit (its fit_parameters); None: a new EAGLE head."""
        self.args = args
        self.runner = runner
        cfg = runner.hf_config
        self.hidden = cfg.hidden_size
        # Long enough to learn from; hidden states made plain tensors (generated in inference mode).
        samples = [
            Sample(s.tokens, s.prompt_len, s.hidden.clone())
            for s in samples
            if _answer_rows(s) >= 2
        ]
        if len(samples) < 2:
            raise ValueError("train-eagle: fewer than two answers long enough to learn from")
        random.Random(args.seed).shuffle(samples)
        n_eval = max(1, len(samples) // 20)
        self.eval_samples, self.train_samples = samples[:n_eval], samples[n_eval:]
        self.vocab_ids = self._token_map(samples)
        with torch.no_grad():  # (not inference mode: the loss multiplies by it under autograd)
            self.lm_head = lm_head_rows(
                runner.model, self.vocab_ids, self.hidden
            )  # [columns, hidden]
        torch.manual_seed(args.seed)
        if head is None:
            self.head = EagleHead(EagleHeadConfig.for_target(cfg, "eagle"))
            self._identity_init()
            params = list(self.head.parameters())
        else:
            self.head, params = head, head.fit_parameters()
            for p in params:
                p.requires_grad_(True)
        self.params = params
        self.opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.batches = self._schedule()
        self.state = TrainState(total_steps=len(self.batches))

    def _token_map(self, samples: list[Sample]) -> torch.Tensor:
        vocab = self.runner.vocab_size
        if not self.args.hot_vocab or self.args.hot_vocab >= vocab:
            return torch.arange(vocab)
        counts = torch.zeros(vocab, dtype=torch.int64)
        for s in samples:
            counts += torch.bincount(
                torch.tensor(s.tokens[s.prompt_len :] or s.tokens), minlength=vocab
            )
        # The most frequent answer tokens; ties (unseen tokens) broken by id, so the map is
        # deterministic.
        order = torch.argsort(counts * vocab - torch.arange(vocab), descending=True)
        return order[: self.args.hot_vocab].sort().values

    def _identity_init(self) -> None:
        with torch.no_grad():
            h = self.hidden
            self.head.fc.weight.normal_(0.0, 0.02)
            self.head.fc.weight[:, h:] += torch.eye(h)
            self.head.fc.bias.zero_()
            for layer in self.head.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()

    def _schedule(self) -> list[list[int]]:
        """Every optimizer step's samples, from the seed alone (so --resume replays the same
        order)."""
        rng = random.Random(self.args.seed + 1)
        batches, total = [], 0
        epochs = max(self.args.epochs, 1e-9)
        budget = epochs * sum(_answer_rows(s) for s in self.train_samples)
        while total < budget:
            order = list(range(len(self.train_samples)))
            rng.shuffle(order)
            batch, size = [], 0
            for i in order:
                batch.append(i)
                size += _answer_rows(self.train_samples[i])
                if size >= self.args.batch_tokens:
                    batches.append(batch)
                    total += size
                    batch, size = [], 0
                    if total >= budget:
                        break
            if batch and total < budget:
                batches.append(batch)
                total += size
        if self.args.max_steps is not None:
            batches = batches[: self.args.max_steps]
        return batches

    # ------------------------------------------------------------------ the loss
    def _sample_loss(self, s: Sample, noise: bool) -> tuple[torch.Tensor, int, int]:
        """EAGLE's loss summed over s's answer positions (as EAGLE's loss mask: t whose prediction,
        the token at t + 2, is the answer's), their count, and how many top tokens match the
        target's. The prompt's rows still run: they are the context the answer's rows attend."""
        ids = torch.tensor(s.tokens[1:-1])
        feats, target = s.hidden[:-1], s.hidden[1:]
        if noise:
            feats = feats + (torch.rand_like(feats) - 0.5) * NOISE
        with torch.no_grad():
            embeds = self.runner.model.model.embed_tokens(ids).float()
        pred, _ = self.head(
            embeds, feats, torch.arange(len(ids)), causal_attend(), from_target=True
        )
        first = max(s.prompt_len - 2, 0)
        pred, target = pred[first:], target[first:]
        vloss = F.smooth_l1_loss(pred, target, reduction="none").mean(-1)
        with torch.no_grad():
            p = torch.softmax(target @ self.lm_head.T, dim=-1)
        logp = torch.log_softmax(pred @ self.lm_head.T, dim=-1)
        ploss = -(p * logp).sum(-1)
        correct = int((logp.argmax(-1) == p.argmax(-1)).sum())
        return (vloss + P_WEIGHT * ploss).sum(), len(pred), correct

    def evaluate(self) -> tuple[float, float]:
        self.head.eval()
        loss, n, correct = 0.0, 0, 0
        with torch.no_grad():
            for s in self.eval_samples:
                ls, k, c = self._sample_loss(s, noise=False)
                loss, n, correct = loss + float(ls), n + k, correct + c
        self.head.train()
        return loss / max(n, 1), correct / max(n, 1)

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        from tqdm import tqdm

        a, st = self.args, self.state
        warmup = max(1, st.total_steps // 20)
        self.head.train()
        with tqdm(
            total=st.total_steps, initial=st.step, desc="training the head", unit="step"
        ) as bar:
            while st.step < st.total_steps:
                t0 = time.perf_counter()
                for group in self.opt.param_groups:
                    group["lr"] = a.lr * min(1.0, (st.step + 1) / warmup)
                self.opt.zero_grad()
                samples = [self.train_samples[i] for i in self.batches[st.step]]
                rows = sum(_answer_rows(s) for s in samples)
                loss_sum = 0.0
                for s in samples:
                    loss, _, _ = self._sample_loss(s, noise=True)
                    (loss / rows).backward()
                    loss_sum += float(loss.detach())
                torch.nn.utils.clip_grad_norm_(self.params, 0.5)
                self.opt.step()
                st.step += 1
                st.seconds += time.perf_counter() - t0
                st.loss = loss_sum / rows
                bar.update(1)
                bar.set_postfix(loss=f"{st.loss:.4f}")
                if st.step % a.save_every == 0 or st.step == st.total_steps:
                    st.loss, st.accuracy = self.evaluate()
                    bar.set_postfix(loss=f"{st.loss:.4f}", acc=f"{st.accuracy:.3f}")
                    self.save()

    def save(self) -> None:
        out = self.args.output
        if getattr(self.head.cfg, "kind", None) == "nextn":
            from radixlm.speculative.mtp_train import save_mtp_fit

            save_mtp_fit(self.head, os.path.join(out, "mtp_fit.safetensors"))
        else:
            save_eagle_head(self.head, out, {})
        save_token_map(self.vocab_ids, os.path.join(out, "token_map.pt"))
        tmp = os.path.join(out, "checkpoint.pt.tmp")
        torch.save(
            {
                "head": self.head.state_dict(),
                "opt": self.opt.state_dict(),
                "state": asdict(self.state),
                "rng": torch.get_rng_state(),
            },
            tmp,
        )
        os.replace(tmp, os.path.join(out, "checkpoint.pt"))
        with open(os.path.join(out, "training.json"), "w", encoding="utf-8") as f:
            json.dump(
                {
                    **asdict(self.state),
                    "train_samples": len(self.train_samples),
                    "train_positions": sum(_answer_rows(s) for s in self.train_samples),
                    "eval_samples": len(self.eval_samples),
                    "token_map": int(self.vocab_ids.numel()),
                    "args": {k: v for k, v in vars(self.args).items() if not callable(v)},
                },
                f,
                indent=2,
            )

    def load(self, file: str) -> None:
        ckpt = torch.load(file, weights_only=False)
        self.head.load_state_dict(ckpt["head"])
        self.opt.load_state_dict(ckpt["opt"])
        saved = TrainState(**ckpt["state"])
        self.state.step, self.state.seconds = saved.step, saved.seconds
        self.state.loss, self.state.accuracy = saved.loss, saved.accuracy
        torch.set_rng_state(ckpt["rng"])
        if self.state.step > self.state.total_steps:
            raise ValueError(
                f"--resume: the checkpoint is at step {self.state.step}, past this run's "
                f"{self.state.total_steps} (other --epochs or data?)"
            )
        logger.info(
            "train-eagle: resuming at step %d of %d", self.state.step, self.state.total_steps
        )
