#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into fuzz/corpus/<target>/seed-<name>.

Small, realistic inputs: request heads, bodies and streams like the ones in the unit tests and
docs, string literals lifted from the unit tests themselves, and the binary inputs (HTTP/2
frames, tunnel preambles, signed tokens, protobuf messages) built here so they can be read and
regenerated. Run from anywhere: `python3 fuzz/seeds/make.py`. Deterministic; it replaces the
seed-* files and leaves the other corpus files (cmin-*, minimized
finds of long runs; see README.md) alone.
"""

import base64
import hashlib
import hmac
import json
import pathlib
import re
import struct

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "fuzz" / "corpus"

# Test material only; the same constants are in the fuzz targets.
TUNNEL_SECRET = b"hivenet-fuzz-secret-0123456789abcdef"
REDIRECT_SECRET = b"hivenet-fuzz-redirect-secret-0123456789abcdef"
REDIRECT_NOW_UNIX_MS = 1_800_000_000_000
FAR_FUTURE_S = 4_102_444_800  # 2100-01-01


def write(target, seeds):
    directory = CORPUS / target
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("seed-*"):
        old.unlink()
    for name, data in seeds.items():
        if isinstance(data, str):
            data = data.encode()
        (directory / f"seed-{name}").write_bytes(data)


def raw_strings(path, must_contain, limit=24):
    """The r#"..."# literals of a Rust file that contain `must_contain`, unescaped as Rust would."""
    text = (ROOT / path).read_text()
    found = []
    for literal in re.findall(r'b?r#"(.*?)"#', text, re.S):
        if must_contain in literal and literal not in found:
            found.append(literal)
    return {f"{pathlib.Path(path).stem}-{i}": s for i, s in enumerate(found[:limit])}


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(claims, secret=TUNNEL_SECRET):
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = b64url(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = f"{header}.{body}".encode()
    mac = hmac.new(secret, signing_input, hashlib.sha256).digest()
    return f"{header}.{body}.{b64url(mac)}"


PEER = "12D3KooWGzBZL6AZtnrD2EK2hRmNZT9Ev4KL8ZTjcpNTQpSKXHyt"
# The router of the fuzz targets (`ROUTER_PEER_ID`, `SESSION_ISSUER` in grpc_control.rs and
# tunnel_preamble.rs): a session token names the router run that issued it, an authentication
# token the router and the router nonce it answers.
ROUTER = "12D3KooWfuzzrouter"
SESSION_ISSUER = ROUTER + "/0000000000000000"
SESSION_TOKEN = jwt({"sub": PEER, "aud": "hivenet-router-session", "iat": 1_700_000_000,
                     "exp": FAR_FUTURE_S, "sid": 1, "rtr": SESSION_ISSUER})
AUTH_TOKEN = jwt({"sub": PEER, "aud": ROUTER, "iat": 1_700_000_000,
                  "exp": FAR_FUTURE_S, "sid": 0, "nonce": "00" * 40})


# ----- HTTP/1.1 heads -----------------------------------------------------------------------

CHAT_HEAD = (b"POST /v1/chat/completions?beta=true HTTP/1.1\r\nHost: router.example\r\n"
             b"Authorization: Bearer sk-test\r\nContent-Type: application/json\r\n"
             b"Content-Length: 42\r\nX-Request-ID: 6f1c2a9e-4b7d-4e21-9c3a-2d5e8f9a0b1c\r\n\r\n")
heads = {
    "chat": CHAT_HEAD,
    "chat-with-body": CHAT_HEAD + b'{"model":"m","messages":[]}',
    "messages": b"POST /v1/messages HTTP/1.1\r\nhost: a\r\nx-api-key: sk-ant\r\n"
                b"anthropic-version: 2023-06-01\r\ntransfer-encoding: chunked\r\n\r\n",
    "models-http10": b"GET /v1/models HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
    "health-bare-lf": b"GET /health HTTP/1.1\nHost: a\n\n",
    "expect": b"POST /v1/embeddings HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n"
              b"Content-Length: 5\r\n\r\nhello",
    "upgrade-h2c": b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                   b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    "smuggle-cl-te": b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    "conflicting-cl": b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    "te-gzip": b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    "pipelined": b"GET /health HTTP/1.1\r\n\r\nGET /v1/models HTTP/1.1\r\n\r\n",
    "admin": b"DELETE /admin/api-keys/k1 HTTP/1.1\r\nAuthorization: Bearer admin\r\n\r\n",
    "h2-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "partial": b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Le",
}
write("http_head", heads)

# ----- chunked bodies -----------------------------------------------------------------------

write("chunked", {
    "two-chunks": b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    "extensions": b"5;name=value\r\nhello\r\n0\r\n\r\n",
    "trailers": b"3\r\nabc\r\n0\r\nX-Trailer: 1\r\nX-Other: 2\r\n\r\n",
    "upper-hex-leading-zeros": b"000A\r\n0123456789\r\n0\r\n\r\n",
    "json": b'1b\r\n{"model":"m","messages":[]}\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n',
    "bare-lf": b"5\nhello\n0\n\n",
    "overflow": b"10000000000000000\r\n",
    "unfinished": b"ff\r\nabc",
})

# ----- engine response heads -----------------------------------------------------------------

write("http_response", {
    "json": b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}',
    "sse-chunked": b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\ndata:\r\n",
    "continue-then-final": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    "http10-keep-alive": b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc",
    "until-close": b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nbody",
    "cl-and-te": b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
    "cl-list": b"HTTP/1.1 200 OK\r\ncontent-length: 7, 7\r\ncontent-length: 7\r\n\r\n",
    "cl-conflict": b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
    "no-content": b"HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n",
    "partial": b"HTTP/1.1 200 OK\r\ncontent-ty",
    "uvicorn": b"HTTP/1.1 200 OK\r\ndate: Wed, 02 Dec 2026 09:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 12\r\ncontent-type: application/json\r\n\r\n",
})

# ----- lean tunnel frames (tunnel::wire) -----------------------------------------------------

def lean_frame(kind, flags, stream, payload):
    return struct.pack(">IBBI", len(payload), kind, flags, stream) + payload


def lean_fields(pairs):
    return b"".join(struct.pack(">B", len(n)) + n + struct.pack(">H", len(v)) + v for n, v in pairs)


_request = (b"\x04POST" + struct.pack(">H", 20) + b"/v1/chat/completions"
            + lean_fields([(b"content-type", b"application/json"),
                           (b"x-request-id", b"5f0c6a1e-8b2d-4c3f-9a7e-1d2b3c4d5e6f")]))
_response = struct.pack(">H", 200) + lean_fields([(b"content-type", b"text/event-stream")])
write("tunnel_frames", {
    "request-and-body": lean_frame(1, 0, 1, _request) + lean_frame(3, 1, 1, b'{"model":"m"}'),
    "response-stream": lean_frame(2, 0, 1, _response) + lean_frame(3, 0, 1, b"data: {}\n\n")
                       + lean_frame(3, 1, 1, b"data: [DONE]\n\n"),
    "reset-credit-ping": lean_frame(4, 0, 3, struct.pack(">I", 8)) + lean_frame(5, 0, 0, struct.pack(">I", 65536))
                         + lean_frame(6, 1, 0, struct.pack(">Q", 7)) + lean_frame(7, 0, 0, struct.pack(">II", 5, 0)),
    "unknown-kind": lean_frame(200, 0, 9, b"later") + lean_frame(6, 0, 0, struct.pack(">Q", 1)),
    "oversized": struct.pack(">IBBI", 1 << 21, 3, 0, 1),
})

# ----- request bodies -----------------------------------------------------------------------

bodies = {
    "chat": '{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}],"max_tokens":64}',
    "stream": '{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}',
    "stream-options": '{"model":"m","stream":true,"stream_options":{"include_usage":false},"messages":[]}',
    "stream-options-null": '{"stream_options":null,"model":"m","stream":true}',
    "images": '{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}',
    "anthropic": '{"model":"claude","max_tokens":1024,"system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"42"},{"type":"image","source":{}}]}]},{"role":"assistant","content":[{"type":"tool_use","id":"t2","name":"calc","input":{"x":1}}]}]}',
    "tools": '{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}]}',
    "escapes": '{"model":"caf\\u00e9","messages":[{"content":"line\\nbreak \\ud83d\\ude00"}],"max_completion_tokens":10}',
    "embeddings": '{"model":"BAAI/bge-m3","input":["a","b"]}',
}
bodies.update(raw_strings("src/wire/http/fields.rs", '"model"'))
bodies.update(raw_strings("src/wire/http/prompt.rs", "messages"))
write("body_fields", bodies)

# ----- backend responses and streams --------------------------------------------------------

openai_stream = (
    'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hel"}}],"usage":null}\n\n'
    'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"lo"}}],"usage":null}\n\n'
    'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}\n\n'
    "data: [DONE]\n\n")
anthropic_stream = (
    'event: message_start\r\ndata: {"type":"message_start","message":{"id":"m1","usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}}}\r\n\r\n'
    ': keep-alive\r\n\r\n'
    'event: content_block_delta\r\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}\r\n\r\n'
    'event: message_delta\r\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}\r\n\r\n'
    'event: message_stop\r\ndata: {"type":"message_stop"}\r\n\r\n')
streams = {
    "openai-stream": openai_stream,
    "anthropic-stream": anthropic_stream,
    "multiline-data": "data: {\"usage\":\ndata: {\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n",
    "openai-body": '{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}',
    "embeddings-body": '{"object":"list","data":[],"usage":{"prompt_tokens":8,"total_tokens":8}}',
    "anthropic-body": '{"id":"m","type":"message","usage":{"input_tokens":10,"cache_creation_input_tokens":2,"output_tokens":20}}',
    "unterminated": 'data: {"choices":[],"usage":{"prompt_tokens":1}}',
}
streams.update(raw_strings("src/logic/usage/tests.rs", "usage", limit=16))
write("sse_usage", streams)

# ----- h2c: client frames after the preface -------------------------------------------------


def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_literal(name, value):
    """Literal header field without indexing, new name, no Huffman (RFC 7541 §6.2.2)."""
    def string(text):
        assert len(text) < 127
        return bytes([len(text)]) + text
    return b"\x00" + string(name) + string(value)


def headers_block(fields):
    return b"".join(hpack_literal(name, value) for name, value in fields)


SETTINGS = frame(0x4, 0, 0, b"")
SETTINGS_ACK = frame(0x4, 0x1, 0, b"")
END_STREAM, END_HEADERS = 0x1, 0x4
chat_fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/v1/chat/completions"),
               (b":authority", b"router.example"), (b"content-type", b"application/json"),
               (b"authorization", b"Bearer sk-test"),
               (b"x-request-id", b"6f1c2a9e-4b7d-4e21-9c3a-2d5e8f9a0b1c")]
body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
h2c = {
    "chat": SETTINGS + frame(0x1, END_HEADERS, 1, headers_block(chat_fields))
            + frame(0x0, END_STREAM, 1, body) + SETTINGS_ACK,
    "models-get": SETTINGS + frame(0x1, END_HEADERS | END_STREAM, 1, headers_block([
        (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/v1/models"),
        (b":authority", b"a")])),
    "indexed-get": SETTINGS + frame(0x1, END_HEADERS | END_STREAM, 1, b"\x82\x86\x84\x41\x01a"),
    "messages-continuation": SETTINGS + frame(0x1, 0, 3, headers_block(chat_fields[:3]))
            + frame(0x9, END_HEADERS, 3, headers_block([(b":authority", b"a"), (b"x-api-key", b"k"),
                                                       (b"anthropic-version", b"2023-06-01")]))
            + frame(0x0, 0, 3, body[:10]) + frame(0x0, END_STREAM, 3, body[10:]),
    "two-streams-reset": SETTINGS + frame(0x1, END_HEADERS, 1, headers_block(chat_fields))
            + frame(0x3, 0, 1, struct.pack(">I", 8))
            + frame(0x1, END_HEADERS | END_STREAM, 3, headers_block([
                (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/health?x=1"),
                (b":authority", b"a")]))
            + frame(0x6, 0, 0, b"pingping") + frame(0x8, 0, 0, struct.pack(">I", 65535))
            + frame(0x7, 0, 0, struct.pack(">II", 3, 0)),
    "admin-put": SETTINGS + frame(0x1, END_HEADERS, 5, headers_block([
        (b":method", b"PUT"), (b":scheme", b"http"), (b":path", b"/admin/policy"),
        (b":authority", b"a"), (b"authorization", b"Bearer admin")]))
            + frame(0x0, END_STREAM, 5, b"routing_policy:\n  strategy: least-loaded\n"),
}
write("h2c_request", h2c)

# ----- tunnel preambles ---------------------------------------------------------------------


def preamble(shard, token, magic=b"HNT1"):
    token = token.encode()
    return magic + struct.pack(">HH", shard, len(token)) + token


write("tunnel_preamble", {
    "session": preamble(0, SESSION_TOKEN),
    "session-lean": preamble(0, SESSION_TOKEN, b"HNT2"),
    "session-shard-3": preamble(3, SESSION_TOKEN),
    "auth-token": preamble(1, AUTH_TOKEN),
    "bad-token": preamble(0, "abc.def.ghi"),
    "bad-magic": b"GET / HTTP/1.1\r\n\r\n",
    "tls-hello": b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
    "too-long": b"HNT1\x00\x00\x13\x88",
    "truncated": preamble(0, SESSION_TOKEN)[:40],
})

# ----- redirect tokens ----------------------------------------------------------------------

MAC_DOMAIN = b"hivenet-router/redirect-token/v1\0"


def redirect_token(key, model, hops, from_site, to_site, expires_unix_ms, nonce,
                   secret=REDIRECT_SECRET):
    payload = bytes([1, hops]) + struct.pack(">q", expires_unix_ms) + nonce
    for text in (key, model, from_site, to_site):
        text = text.encode()
        payload += struct.pack(">I", len(text)) + text
    mac = hmac.new(secret, MAC_DOMAIN + payload, hashlib.sha256).digest()
    return f"{b64url(payload)}.{b64url(mac)}"


good = redirect_token("key-1", "llama-3-70b", 1, "site-fr-1", "site-de-1",
                      REDIRECT_NOW_UNIX_MS + 30_000, bytes(range(16)))
write("redirect_token", {
    "good": good,
    "second-hop": redirect_token("", "bge-m3", 2, "site-de-1", "site-fr-1",
                                 REDIRECT_NOW_UNIX_MS + 59_000, b"\xff" * 16),
    "expired": redirect_token("key-1", "m", 1, "a", "b", REDIRECT_NOW_UNIX_MS - 1, bytes(16)),
    "too-far-ahead": redirect_token("key-1", "m", 1, "a", "b", REDIRECT_NOW_UNIX_MS + 3_600_000,
                                    bytes(16)),
    "hops-zero": redirect_token("key-1", "m", 0, "a", "b", REDIRECT_NOW_UNIX_MS + 1000, bytes(16)),
    "other-secret": redirect_token("k", "m", 1, "a", "b", REDIRECT_NOW_UNIX_MS + 1000, bytes(16),
                                   secret=b"x" * 32),
    "target": f"/v1/chat/completions?stream=1&hivenet_redirect={good}#frag",
    "target-twice": f"/v1/embeddings?hivenet_redirect=&hivenet_redirect={good}",
    "secret-file": "# rotation: new secret first\n" + "n" * 40 + "\n\n  " + "o" * 32 + "  \n",
})

# ----- sibling maps -------------------------------------------------------------------------

maps = {
    "reference": {
        "sites": [{"id": "site-fr-1", "url": "https://fr1.example.com"}],
        "placements": [{"model": "llama-3-70b", "kind": "chat", "site": "site-fr-1",
                        "scale_from_zero": True, "hold_budget": "240s", "warm": False}],
        "generated_at": "2026-11-29T20:00:00Z", "fresh_for": "60s"},
    "three-sites": {
        "sites": [{"id": "site-local", "url": "http://127.0.0.1:8080/"},
                  {"id": "site-a", "url": "https://a.hivenet.test:8443/prefix"},
                  {"id": "site-b", "url": "https://B.Example.com"}],
        "placements": [
            {"model": "m", "kind": "chat", "site": "site-local", "scale_from_zero": True},
            {"model": "m", "kind": "chat", "site": "site-a", "warm": True},
            {"model": "m", "kind": "chat", "site": "site-b", "warm": False,
             "hold_budget": "1h"},
            {"model": "bge", "kind": "embedding", "site": "site-b"},
            {"model": "rr", "kind": "rerank", "site": "site-a", "hold_budget": "1m30.5s"}],
        "generated_at": "2026-11-29T20:00:00.123+01:00", "fresh_for": "5m"},
    "empty": {"sites": [], "placements": []},
    "ipv6": {"sites": [{"id": "v6", "url": "http://[::1]:9000"}], "placements": []},
}
write("sibling_map", {name: json.dumps(value) for name, value in maps.items()})

# ----- auth.yaml ----------------------------------------------------------------------------

auth = {path.stem: path.read_text()
        for path in sorted((ROOT / "tests" / "fixtures" / "auth").glob("*.yaml"))}
auth["none"] = "api:\n  mode: none\n"
auth["dynamic"] = "api:\n  mode: dynamic\nadmin:\n  mode: api-key\n"
auth["empty"] = ""
write("auth_yaml", auth)

# ----- policy YAML --------------------------------------------------------------------------

policies = {
    "minimal": "routing_policy:\n  strategy: least-loaded\n",
    "json": '{"routing_policy": {"strategy": "least-loaded", "max_tries": 2}}',
    "serverless": "mode: serverless\nmax_input_tokens: 8192\nrouting_policy:\n  strategy: least-loaded\n",
    "gates": "shed_if:\n  kv_cache_utilization:\n    gt: 0.9\n  waiting_requests:\n    gte: 20\n"
             "routing_policy:\n  strategy: least-loaded\n  exclude_if:\n    success_rate:\n      lt: 0.5\n"
             "    srtt:\n      gt: 250\n",
    "fallback": "routing_policy:\n  match:\n    engine: vllm\n    tags: [gpu, '']\n  strategy: least-loaded\n"
                "fallback_chain:\n  - name: any\n    strategy: least-loaded\n  - name: cheap\n    strategy: round-robin\n"
                "fallback_provider:\n  engine: openai\n  model: gpt-4o-mini\n",
    "named": "models:\n  - meta-llama/Llama-3.1-8B-Instruct\n  - meta-llama/Llama-3.1-8B-Instruct\n"
             "routing_policy:\n  strategy: least-loaded\n",
    "bad": "routing_policy:\n  name: x\n  strategy: weighted\nmode: fast\nshed_if:\n  gpu_temp: {gt: .inf}\n",
    "anchors": "base: &b {strategy: least-loaded}\nrouting_policy: *b\n",
}
policies.update(raw_strings("src/logic/policy/compile/tests.rs", "routing_policy"))
write("policy_yaml", policies)

# ----- gRPC control messages ----------------------------------------------------------------


def varint(value):
    out = b""
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def field_bytes(number, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(number << 3 | 2) + varint(len(data)) + data


def field_varint(number, value):
    return varint(number << 3) + varint(value)


def field_double(number, value):
    return varint(number << 3 | 1) + struct.pack("<d", value)


def delimited(message):
    return varint(len(message)) + message


OP_AUTH, OP_MESSAGE, OP_TUNNEL_UP, OP_TUNNEL_DOWN, OP_CLOCK, OP_CLOSE, OP_SELECT, OP_SNAPSHOT = range(8)
auth_request = field_bytes(1, AUTH_TOKEN) + field_bytes(2, PEER) + field_varint(3, 4)
register = (field_bytes(1, "meta-llama/Llama-3.1-8B-Instruct") + field_bytes(1, " qwen ")
            + field_bytes(2, "llm") + field_varint(3, 8) + field_bytes(4, "vllm")
            + field_bytes(5, "gpu") + field_bytes(6, "EU-France") + field_bytes(7, "0.3.0")
            + field_bytes(8, "deploy-1") + field_bytes(9, "replica-1"))
heartbeat = field_varint(1, 1_800_000_000_000) + field_varint(2, 3)
signal = field_varint(1, 2) + field_varint(2, 1) + field_double(3, 0.75) + field_varint(4, 2) + field_varint(5, 1)
refresh = field_bytes(1, SESSION_TOKEN)


def message(kind, body):
    return bytes([OP_MESSAGE]) + delimited(field_bytes(kind, body))


session = (bytes([OP_AUTH]) + delimited(auth_request) + message(1, register)
           + bytes([OP_TUNNEL_UP, 0, OP_TUNNEL_UP, 1]) + message(2, heartbeat) + message(3, signal)
           + bytes([OP_SNAPSHOT]))
write("grpc_control", {
    "session": session,
    "session-lost": session + bytes([OP_TUNNEL_DOWN, 1, OP_CLOCK, 60, OP_TUNNEL_UP, 1, OP_CLOCK, 200]),
    "two-agents": session + bytes([OP_AUTH]) + delimited(auth_request) + message(1, register)
                  + bytes([OP_TUNNEL_UP, 0, OP_TUNNEL_UP, 1, OP_SELECT, 0, OP_CLOSE, OP_SNAPSHOT]),
    "re-register": session + message(1, field_bytes(1, 'odd "model"\n\x01') + field_bytes(2, "embedding")
                                      + field_varint(3, 1)) + bytes([OP_SNAPSHOT]),
    "refused": bytes([OP_AUTH]) + delimited(auth_request) + message(1, field_bytes(2, "gpu")),
    "refresh": session + message(4, refresh) + message(4, field_bytes(1, "bad")),
})
