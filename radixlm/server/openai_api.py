"""OpenAI-compatible routes (/v1/*). Placeholder until the OpenAI API is written."""


def register_openai_routes(app, srv, HTTPError, read_json, check_queue, observe, run_until_disconnect) -> None:
    return None
