"""A recorded-shape Claude Code session for /v1/messages replays (tests/e2e/test_agent_sessions.py).

The request shape is Claude Code 2.1.x's, as its public issue threads show it (anthropics/
claude-code#68900, llama.cpp PR #21793, vLLM PR #36829): `system` is three text blocks, the first
the billing line `x-anthropic-billing-header: cc_version=<semver>.<3 hex>; cc_entrypoint=cli;
cch=<5 hex>;` (both hex values new on every request), then the identity line and the instructions,
each with `cache_control: {"type": "ephemeral"}`; `tools` are its built-in tools with JSON-schema
inputs; user turns carry `<system-reminder>` text blocks and tool_result blocks, assistant turns
text and tool_use blocks, the last user block marked with cache_control; every request streams.
The texts are written for this test (a ~1.5k-token tools + instructions prefix on the default
model's tokenizer), not Claude Code's own.
"""

from __future__ import annotations

import random

EPHEMERAL = {"type": "ephemeral"}

INSTRUCTIONS = """You are an interactive command line tool that helps users with software \
engineering tasks. Use the instructions below and the tools available to you to assist the user.

# Tone and style
Be concise, direct and to the point. Answer in fewer than four lines unless the user asks for \
detail. Do not add preambles or summaries of what you did unless asked. When you run a \
non-trivial bash command, explain what it does and why. Output text to communicate with the user; \
never use tools or code comments as a means to talk to the user.

# Proactiveness
Do what the user asked, nothing more and nothing less. Never create files unless they are \
necessary for the goal. Prefer editing an existing file to creating a new one. Never create \
documentation files unless the user asks for them.

# Following conventions
When you change a file, first understand its code conventions. Mimic code style, use existing \
libraries and utilities, and follow existing patterns. Never assume that a library is available: \
check that the codebase already uses it (look at neighbouring files, or the package manifest). \
When you create a new component, look at existing components first. Always follow security best \
practices: never introduce code that exposes or logs secrets and keys.

# Doing tasks
The user will mostly ask you to fix bugs, add functionality, refactor code or explain code. For \
these tasks: use the search tools to understand the codebase and the user's query; implement the \
solution using all tools available to you; verify the solution with the project's tests (never \
assume a test framework: read the README or search the codebase); when you are done, run the lint \
and type-check commands the project uses. Never commit changes unless the user asks you to.

# Tool usage policy
When doing a file search, prefer the Glob and Grep tools. You can call multiple tools in a single \
response: when several independent pieces of information are needed, batch the tool calls. Read \
a file before you edit it. Keep paths absolute.

Here is useful information about the environment you are running in:
<env>
Working directory: /home/dev/project
Is directory a git repo: Yes
Platform: linux
</env>"""

IDENTITY = "You are Claude Code, Anthropic's official CLI for Claude."


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "name": name,
        "description": description,
        "input_schema": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        },
    }


_S = {"type": "string"}
_N = {"type": "number"}
TOOLS = [
    _tool(
        "Bash",
        "Executes a bash command in a persistent shell session with an optional timeout. Quote "
        "paths that contain spaces. Avoid find and grep: use Glob and Grep. Use ; or && to run "
        "several commands; never use newlines to separate them.",
        {
            "command": {**_S, "description": "The command to execute"},
            "timeout": {**_N, "description": "Optional timeout in milliseconds (max 600000)"},
            "description": {**_S, "description": "What this command does, in 5-10 words"},
        },
        ["command"],
    ),
    _tool(
        "Glob",
        "Fast file pattern matching that works with any codebase size. Supports patterns like "
        "**/*.js or src/**/*.ts and returns matching paths sorted by modification time.",
        {
            "pattern": {**_S, "description": "The glob pattern to match files against"},
            "path": {**_S, "description": "The directory to search in (default: the cwd)"},
        },
        ["pattern"],
    ),
    _tool(
        "Grep",
        "A powerful search tool built on ripgrep. Supports full regex syntax, filters files with "
        "the glob parameter or the type parameter, and has output modes content, "
        "files_with_matches (the default) and count.",
        {
            "pattern": {**_S, "description": "The regular expression to search for"},
            "path": {**_S, "description": "File or directory to search in"},
            "glob": {**_S, "description": "Glob pattern to filter files"},
            "output_mode": {
                "type": "string",
                "enum": ["content", "files_with_matches", "count"],
                "description": "What to output",
            },
            "-n": {"type": "boolean", "description": "Show line numbers"},
        },
        ["pattern"],
    ),
    _tool(
        "Read",
        "Reads a file from the local filesystem. The file_path must be absolute. By default it "
        "reads up to 2000 lines from the start; give an offset and a limit for long files. "
        "Results use cat -n format, line numbers starting at 1.",
        {
            "file_path": {**_S, "description": "The absolute path to the file to read"},
            "offset": {**_N, "description": "The line number to start reading from"},
            "limit": {**_N, "description": "The number of lines to read"},
        },
        ["file_path"],
    ),
    _tool(
        "Edit",
        "Performs exact string replacements in files. Read the file first. The edit fails if "
        "old_string is not unique in the file: give more context, or use replace_all.",
        {
            "file_path": {**_S, "description": "The absolute path to the file to modify"},
            "old_string": {**_S, "description": "The text to replace"},
            "new_string": {**_S, "description": "The text to replace it with"},
            "replace_all": {"type": "boolean", "default": False},
        },
        ["file_path", "old_string", "new_string"],
    ),
    _tool(
        "Write",
        "Writes a file to the local filesystem, overwriting any existing file at that path. Read "
        "an existing file first. Never create documentation files unless asked.",
        {
            "file_path": {**_S, "description": "The absolute path to the file to write"},
            "content": {**_S, "description": "The content to write to the file"},
        },
        ["file_path", "content"],
    ),
    _tool(
        "TodoWrite",
        "Creates and manages a structured task list for the current coding session, to track "
        "progress and organize complex tasks. Mark each task in_progress before starting it and "
        "completed as soon as it is done.",
        {
            "todos": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "content": {"type": "string", "minLength": 1},
                        "status": {
                            "type": "string",
                            "enum": ["pending", "in_progress", "completed"],
                        },
                        "id": {"type": "string"},
                    },
                    "required": ["content", "status", "id"],
                },
            }
        },
        ["todos"],
    ),
]


def billing_line(rng: random.Random, version: str = "2.1.177") -> str:
    """The first system block's text: a new fingerprint and cch on every request."""
    return (
        f"x-anthropic-billing-header: cc_version={version}.{rng.randrange(16**3):03x};"
        f" cc_entrypoint=cli; cch={rng.randrange(16**5):05x};"
    )


def system_blocks(billing: str) -> list[dict]:
    return [
        {"type": "text", "text": billing},
        {"type": "text", "text": IDENTITY, "cache_control": EPHEMERAL},
        {"type": "text", "text": INSTRUCTIONS, "cache_control": EPHEMERAL},
    ]


def _reminder(text: str) -> dict:
    return {"type": "text", "text": f"<system-reminder>\n{text}\n</system-reminder>"}


# The session: each turn is what Claude Code appends before its next request (the assistant's
# recorded answer to the previous request, then the user's side).
TURNS: list[list[dict]] = [
    [
        {
            "role": "user",
            "content": [
                _reminder("As you answer the user's questions, you can use the context above."),
                {"type": "text", "text": "Why does test_parse fail? Fix it."},
            ],
        }
    ],
    [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me find the test first."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "Grep",
                    "input": {"pattern": "def test_parse", "output_mode": "files_with_matches"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": "tests/test_config.py",
                }
            ],
        },
    ],
    [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_02",
                    "name": "Read",
                    "input": {"file_path": "/home/dev/project/tests/test_config.py"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_02",
                    "content": "     1\tfrom project.config import parse\n     2\t\n     3\tdef "
                    "test_parse():\n     4\t    assert parse('a=1') == {'a': 1}\n",
                }
            ],
        },
    ],
    [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_03",
                    "name": "Bash",
                    "input": {
                        "command": "python -m pytest tests/test_config.py -q",
                        "description": "Run the failing test",
                    },
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_03",
                    "content": "F\nE   AssertionError: assert {'a': '1'} == {'a': 1}\n1 failed",
                    "is_error": True,
                }
            ],
        },
    ],
    [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "parse returns strings; the test wants ints."},
                {
                    "type": "tool_use",
                    "id": "toolu_04",
                    "name": "Edit",
                    "input": {
                        "file_path": "/home/dev/project/project/config.py",
                        "old_string": "out[k] = v",
                        "new_string": "out[k] = int(v) if v.isdigit() else v",
                    },
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_04",
                    "content": "The file /home/dev/project/project/config.py has been updated.",
                }
            ],
        },
    ],
    [
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Fixed: parse now converts digit values."}],
        },
        {
            "role": "user",
            "content": [
                _reminder("The user opened the file /home/dev/project/project/config.py."),
                {"type": "text", "text": "Thanks. Now run the whole suite."},
            ],
        },
    ],
]


def requests(rng: random.Random) -> list[dict]:
    """The session's 6 requests, each with the history so far and a fresh billing line; the last
    user block carries cache_control, as Claude Code marks it."""
    history: list[dict] = []
    out = []
    for turn in TURNS:
        history = history + turn
        messages = [dict(m, content=[dict(b) for b in m["content"]]) for m in history]
        messages[-1]["content"][-1]["cache_control"] = EPHEMERAL
        out.append(
            {
                "system": system_blocks(billing_line(rng)),
                "tools": TOOLS,
                "messages": messages,
                "metadata": {"user_id": "user_replay_session_0"},
            }
        )
    return out


# --- Codex (/v1/responses) ------------------------------------------------------------------
# Codex CLI's request shape (codex-rs ResponsesApiRequest): model, instructions (its long system
# prompt), input items, function tools (flat: type, name, description, strict, parameters),
# tool_choice "auto", parallel_tool_calls, reasoning {effort, summary}, store, stream: true,
# include, prompt_cache_key. Continued here with previous_response_id: each request sends only
# the turn's new items (the recorded reasoning item, function calls and their outputs, a user
# message).
CODEX_TOOLS = [
    {
        "type": "function",
        "name": t["name"].lower(),
        "description": t["description"],
        "strict": False,
        "parameters": {k: v for k, v in t["input_schema"].items() if k != "$schema"},
    }
    for t in TOOLS
]


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def _output(call_id: str, output: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


_REASONING = {"type": "reasoning", "summary": [], "encrypted_content": None}
CODEX_TURNS: list[list[dict]] = [
    [_user("Why does test_parse fail? Fix it.")],
    [
        {**_REASONING, "id": "rs_1"},
        _call("call_1", "grep", '{"pattern": "def test_parse"}'),
        _output("call_1", "tests/test_config.py"),
    ],
    [
        _call("call_2", "read", '{"file_path": "/home/dev/project/tests/test_config.py"}'),
        _output("call_2", "from project.config import parse\n\ndef test_parse():\n    ..."),
    ],
    [
        {**_REASONING, "id": "rs_3"},
        _call("call_3", "bash", '{"command": "python -m pytest tests/test_config.py -q"}'),
        _output("call_3", "E   AssertionError: assert {'a': '1'} == {'a': 1}\n1 failed"),
    ],
    [
        _call("call_4", "edit", '{"file_path": "config.py", "old_string": "a", "new_string": "b"}'),
        _output("call_4", "The file config.py has been updated."),
    ],
    [_user("Thanks. Now run the whole suite.")],
]


def codex_request(turn: list[dict], previous: str | None) -> dict:
    return {
        "instructions": INSTRUCTIONS,
        "input": turn,
        "tools": CODEX_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": True,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a1f4-codex-session",
        **({"previous_response_id": previous} if previous else {}),
    }
