"""SGLang's own frontend (the `sglang` wheel, installed without its dependencies) running SGLang
programs against a server: `python sglang_programs.py URL` prints one JSON object of results.
Run in a subprocess by test_sglang_frontend.py, so the sglang package never loads into the test
process (which imports only the constants)."""

import json
import sys

GREEDY = {"temperature": 0}
IP_REGEX = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"
CITY_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "population": {"type": "integer"}},
    "required": ["name", "population"],
    "additionalProperties": False,
}


def main(url: str) -> None:
    import sglang as sgl  # here, not at import: the test module imports the constants above

    @sgl.function
    def plain(s, question):
        s += question
        s += sgl.gen("answer", max_tokens=16, **GREEDY)

    @sgl.function
    def multi_turn(s, q1, q2):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(q1)
        s += sgl.assistant(sgl.gen("a1", max_tokens=12, **GREEDY))
        s += sgl.user(q2)
        s += sgl.assistant(sgl.gen("a2", max_tokens=12, **GREEDY))

    @sgl.function
    def regex_ip(s):
        s += "The IP address of the Google DNS server is "
        s += sgl.gen("ip", max_tokens=24, regex=IP_REGEX, **GREEDY)

    @sgl.function
    def json_city(s):
        s += "Describe Paris as JSON with its name and population.\n"
        s += sgl.gen("json", max_tokens=64, json_schema=json.dumps(CITY_SCHEMA), **GREEDY)

    @sgl.function
    def typed(s):
        s += "Q: How many legs does a spider have?\nA: "
        s += sgl.gen("legs", dtype=int, max_tokens=8, **GREEDY)

    @sgl.function
    def forked(s):
        s += "Here are two tips for better sleep.\n"
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"Tip {i + 1}:" + sgl.gen("tip", max_tokens=12, stop="\n", **GREEDY)
        forks.join()
        s += "Tip 1:" + forks[0]["tip"] + "\nTip 2:" + forks[1]["tip"]

    @sgl.function
    def choose(s):
        s += "Q: What color is the sky on a clear day?\nA: " + sgl.select(
            "color", choices=["blue", "green", "red"]
        )

    @sgl.function
    def stop_on_regex(s):
        s += "Count: 1, 2, 3, 4,"
        s += sgl.gen("count", max_tokens=30, stop_regex=r" [6-9],", **GREEDY)

    sgl.set_default_backend(sgl.RuntimeEndpoint(url))
    out = {}
    st = plain.run(question="The capital of France is")
    out["plain"] = {"text": st.text(), "answer": st["answer"]}
    st = multi_turn.run(q1="Name a fruit.", q2="Name a vegetable.")
    out["multi_turn"] = {
        "messages": st.messages(),
        "text": st.text(),
        "a1": st["a1"],
        "a2": st["a2"],
    }
    out["regex"] = {"ip": regex_ip.run()["ip"]}
    out["json"] = {"json": json_city.run()["json"]}
    st = typed.run()
    out["typed"] = {"legs": st["legs"], "type": type(st["legs"]).__name__}
    st = forked.run()
    out["fork"] = {"text": st.text()}
    st = choose.run()
    out["select"] = {"color": st["color"], "meta": st.get_meta_info("color")}
    out["stop_regex"] = {"count": stop_on_regex.run()["count"]}
    # Streaming: the variable's text chunk by chunk.
    st = plain.run(question="The capital of France is", stream=True)
    out["stream"] = {"chunks": list(st.text_iter("answer"))}
    # run_batch: several programs at once.
    states = plain.run_batch(
        [
            {"question": q}
            for q in ("The capital of France is", "Two plus two is", "The largest ocean is")
        ]
    )
    out["batch"] = [s["answer"] for s in states]
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
