"""JSON extraction with `json_schema`: the output is valid JSON for the schema by construction.

python examples/json_extraction.py [http://127.0.0.1:30000]
"""

import json

from _backend import run_example

import radixlm as sgl

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@sgl.function
def extract(s, text):
    s += sgl.user(f"Extract the person's name, age and city as JSON.\nText: {text}")
    s += sgl.assistant(sgl.gen("person", max_tokens=64, json_schema=SCHEMA))


def main(backend) -> list:
    texts = ["Maria is 34 and lives in Lisbon.", "Tom, aged 61, moved to Boston last year."]
    people = []
    for text in texts:
        s = extract.run(text, backend=backend, temperature=0)
        people.append(json.loads(s["person"]))
        print(text, "->", people[-1])
    return people


if __name__ == "__main__":
    run_example(main)
