"""radixlm.lang quick start. Run a server first:  python -m radixlm.cli serve --port 30000
then:  python examples/lang_quickstart.py [http://127.0.0.1:30000]   (or --engine for in-process)."""

import sys

import radixlm.lang as sgl


@sgl.function
def multi_turn(s, question):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=64))
    s += sgl.user("Is your answer correct? Reply True or False.")
    s += sgl.assistant(sgl.select("check", choices=["True", "False"]))


@sgl.function
def tips(s, topic):
    s += f"Here are two tips about {topic}.\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Tip {i + 1}:" + sgl.gen("tip", max_tokens=24)
    forks.join()


def main():
    if "--engine" in sys.argv:
        backend = sgl.EngineBackend(None)
    else:
        backend = sgl.RuntimeEndpoint(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:30000")
    sgl.set_default_backend(backend)
    s = multi_turn.run("What is the capital of France?", temperature=0)
    for m in s.messages():
        print(f"{m['role']}: {m['content']}")
    print("scores:", s.get_meta_info("check")["normalized_prompt_logprobs"])
    print(tips.run("sleep", temperature=0)["tip"])
    for chunk in multi_turn.run("Name a prime number.", stream=True).text_iter("answer"):
        print(chunk, end="", flush=True)
    print()
    backend.shutdown()


if __name__ == "__main__":
    main()
