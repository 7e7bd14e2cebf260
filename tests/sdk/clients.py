"""Drives the router with the official OpenAI and Anthropic Python SDKs (run by tests/sdk_clients.rs).

Usage: clients.py BASE_URL MODEL. Prints one line per check; exits non-zero on the first failure.
"""
import sys

import anthropic
import openai

base, model = sys.argv[1], sys.argv[2]
oa = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

reply = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}])
assert reply.choices[0].message.content, reply
assert reply.usage.completion_tokens > 0, reply.usage
print("openai chat ok", reply.usage.prompt_tokens, reply.usage.completion_tokens)

pieces = []
usage_chunks = 0
for chunk in oa.chat.completions.create(
    model=model, stream=True, max_tokens=4, messages=[{"role": "user", "content": "Hello"}]
):
    if chunk.choices:
        pieces.append(chunk.choices[0].delta.content or "")
    elif chunk.usage is not None:
        usage_chunks += 1
assert "".join(pieces).strip(), pieces
assert usage_chunks == 0, "a usage chunk the client did not ask for reached it"
print("openai stream ok", len(pieces))

last = None
for chunk in oa.chat.completions.create(
    model=model,
    stream=True,
    stream_options={"include_usage": True},
    messages=[{"role": "user", "content": "Hello"}],
):
    last = chunk
assert last is not None and last.usage is not None and last.usage.completion_tokens > 0, last
print("openai stream with usage ok", last.usage.completion_tokens)

try:
    oa.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    raise SystemExit("expected a 404")
except openai.NotFoundError as error:
    assert error.body["code"] == "model_not_found", error.body
    print("openai 404 ok")

an = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
message = an.messages.create(
    model=model, max_tokens=3, messages=[{"role": "user", "content": "Hello"}]
)
assert message.content[0].text and message.usage.output_tokens == 3, message
print("anthropic message ok")

with an.messages.stream(
    model=model, max_tokens=3, messages=[{"role": "user", "content": "Hello"}]
) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
assert text and final.usage.output_tokens == 3, (text, final.usage)
print("anthropic stream ok")

counted = an.messages.count_tokens(model=model, messages=[{"role": "user", "content": "Hello"}])
assert counted.input_tokens > 0, counted
print("anthropic count_tokens ok")
