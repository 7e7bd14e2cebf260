#!/usr/bin/env python3
"""The client side of perf/memory.sh: writes auth.yaml files with N keys, sends one request with each
key, and holds idle keep-alive connections open while the router's memory is read.

Subcommands:
  auth FILE N          auth.yaml with N keys sk-mem-0 .. sk-mem-(N-1), each its own owner with the
                       limits of perf/auth-bench.yaml (RPM and a daily budget, so every key that made
                       a request holds a quota holder; KEY_QUOTA="" for none, KEY_QUOTA="..." for
                       other limits), plus the bench key (BENCH_API_KEY, owner
                       "bench") that the readiness checks use.
  replace PORT N       AUTH_MODE=dynamic: the same keys, loaded into the dynamic registry with one
                       POST /admin/api-keys/replace (admin key ADMIN_API_KEY; the 16 MiB body
                       limit holds about 60,000 such entries)
  writes PORT M        AUTH_MODE=dynamic: M admin writes one after the other on one connection, a
                       PUT /admin/api-keys/{id} of a new key then its DELETE, in turn; prints
                       "count p50_ms p99_ms max_ms" of their answer times (each answer must be 200).
  touch PORT N         one chat request with each key (CONCURRENCY connections, requests one after
                       the other on each); exits non-zero unless every answer is 200.
  connections PORT PID M OUT
                       opens M keep-alive connections, reads the router's memory (PID) with none,
                       with all M idle, then after one chat request on each (answered, then idle
                       again); writes "phase rss_kb pss_kb private_dirty_kb" lines to OUT.

Bounded: every request and connect has a timeout (TIMEOUT, 60 s); a failure exits non-zero.
Standard library only (asyncio, raw HTTP/1.1 with content-length or chunked answers).
"""
import asyncio
import hashlib
import json
import os
import sys
import time

MODEL = os.environ.get("MODEL", "sim-model")
BENCH_KEY = os.environ.get("BENCH_API_KEY", "sk-hivenet-bench")
ADMIN_KEY = os.environ.get("ADMIN_API_KEY", "memory-admin")
CONCURRENCY = int(os.environ.get("CONCURRENCY", "32"))
TIMEOUT = float(os.environ.get("TIMEOUT", "60"))
SETTLE = float(os.environ.get("SETTLE", "2"))
BODY = ('{"model":"%s","messages":[{"role":"user","content":"hi"}]}' % MODEL).encode()
# KEY_QUOTA="" writes keys without limits: no quota holder, so the difference between the two
# runs is what the limits cost per key.
QUOTA = os.environ.get("KEY_QUOTA", "requests_per_minute: 100000000, tokens_per_day: 1000000000000")


def raw_key(index):
    return f"sk-mem-{index}"


def write_auth(path, count):
    def key(raw, owner):
        digest = hashlib.sha256(raw.encode()).hexdigest()
        return (f'    - key_hash: "{digest}"\n      key_preview: "sk-...{raw[-4:]}"\n'
                f'      metadata: {{name: "{raw}", owner: "{owner}"}}\n'
                + (f'      quota: {{{QUOTA}}}\n' if QUOTA else ''))
    with open(path, "w") as out:
        out.write("api:\n  mode: api-key\n  keys:\n")
        out.write(key(BENCH_KEY, "bench"))
        for index in range(count):
            out.write(key(raw_key(index), f"owner-{index}"))


def quota_json():
    """KEY_QUOTA ("name: value, ...", YAML flow style) as a JSON object; None when empty."""
    if not QUOTA:
        return None
    pairs = (item.split(":") for item in QUOTA.split(","))
    return {name.strip(): int(value) for name, value in pairs}


def replace_body(count):
    """The body of POST /admin/api-keys/replace: the bench key and sk-mem-0 .. sk-mem-(N-1), each
    its own owner, with the fields write_auth gives them."""
    quota = quota_json()

    def entry(ident, raw, owner):
        item = {"id": ident, "key_hash": hashlib.sha256(raw.encode()).hexdigest(),
                "key_preview": f"sk-...{raw[-4:]}", "owner": owner, "name": raw, "enabled": True}
        if quota:
            item["quota"] = quota
        return item

    keys = [entry("bench", BENCH_KEY, "bench")]
    keys += [entry(f"mem-{index}", raw_key(index), f"owner-{index}") for index in range(count)]
    return json.dumps({"version": "rev_00000001", "keys": keys}, separators=(",", ":")).encode()


async def replace(port, count):
    body = replace_body(count)
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), TIMEOUT)
    writer.write(b"POST /admin/api-keys/replace HTTP/1.1\r\nhost: memory\r\n"
                 b"content-type: application/json\r\nauthorization: Bearer "
                 + ADMIN_KEY.encode() + b"\r\ncontent-length: " + str(len(body)).encode()
                 + b"\r\nconnection: close\r\n\r\n" + body)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), TIMEOUT)
    writer.close()
    status = int(answer.split(b" ", 2)[1])
    if status != 200:
        sys.exit(f"replace of {count} keys ({len(body)} bytes) answered {status}: {answer[-300:]!r}")
    print(f"replaced the registry with {count + 1} keys ({len(body)} bytes)", file=sys.stderr)


async def writes(port, count):
    """Times `count` admin writes: a new key's PUT, then its DELETE, in turn. What one write costs
    the control core grows with the registry when each write builds the shards' snapshot again."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), TIMEOUT)
    put = json.dumps({"version": "rev_00000001",
                      "key_hash": hashlib.sha256(b"sk-mem-written").hexdigest(),
                      "key_preview": "sk-...tten", "owner": "owner-written", "name": "written",
                      "enabled": True}).encode()
    head = (b" HTTP/1.1\r\nhost: memory\r\nauthorization: Bearer " + ADMIN_KEY.encode()
            + b"\r\ncontent-type: application/json\r\ncontent-length: ")
    took = []
    for index in range(count):
        if index % 2 == 0:
            message = b"PUT /admin/api-keys/mem-written" + head + str(len(put)).encode() + b"\r\n\r\n" + put
        else:
            message = b"DELETE /admin/api-keys/mem-written?version=rev_00000001" + head + b"0\r\n\r\n"
        started = time.perf_counter()
        writer.write(message)
        await writer.drain()
        status = await asyncio.wait_for(read_answer(reader), TIMEOUT)
        took.append((time.perf_counter() - started) * 1000)
        if status != 200:
            sys.exit(f"admin write {index} answered {status}")
    writer.close()
    took.sort()
    pick = lambda q: took[min(len(took) - 1, int(q * len(took)))]
    print(f"{count} {pick(0.5):.2f} {pick(0.99):.2f} {took[-1]:.2f}")


def request(key):
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: memory\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + key.encode() + b"\r\ncontent-length: "
            + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


async def read_answer(reader):
    """Reads one HTTP/1.1 answer; returns its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip().lower()
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status


async def ask(reader, writer, key):
    writer.write(request(key))
    await writer.drain()
    return await asyncio.wait_for(read_answer(reader), TIMEOUT)


async def touch(port, count):
    next_index = iter(range(count))
    failures = []

    async def worker():
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), TIMEOUT)
        for index in next_index:
            status = await ask(reader, writer, raw_key(index))
            if status != 200:
                failures.append((index, status))
        writer.close()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(min(CONCURRENCY, max(count, 1)))))
    print(f"touched {count} keys in {time.monotonic() - started:.1f} s", file=sys.stderr)
    if failures:
        sys.exit(f"{len(failures)} requests failed, first: key {failures[0][0]} status {failures[0][1]}")


def memory_kb(pid):
    """VmRSS from /proc/PID/status; Pss and Private_Dirty from /proc/PID/smaps_rollup (kB)."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                values["rss"] = int(line.split()[1])
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            name = line.split(":")[0]
            if name in ("Pss", "Private_Dirty"):
                values[name] = int(line.split()[1])
    return values["rss"], values["Pss"], values["Private_Dirty"]


async def connections(port, pid, count, out_path):
    out = open(out_path, "w")

    async def record(phase):
        await asyncio.sleep(SETTLE)
        rss, pss, dirty = memory_kb(pid)
        out.write(f"{phase} {rss} {pss} {dirty}\n")
        out.flush()

    await record("none")
    opened = []
    for _ in range(count):
        opened.append(await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), TIMEOUT))
    # Every connection's first read is posted before the figure is taken.
    await record("idle")
    semaphore = asyncio.Semaphore(CONCURRENCY)

    async def once(reader, writer):
        async with semaphore:
            return await ask(reader, writer, BENCH_KEY)

    statuses = await asyncio.gather(*(once(reader, writer) for reader, writer in opened))
    bad = [status for status in statuses if status != 200]
    if bad:
        sys.exit(f"{len(bad)} of {count} requests failed, first status {bad[0]}")
    await record("after_request")
    for _, writer in opened:
        writer.close()
    out.close()


def main():
    command, args = sys.argv[1], sys.argv[2:]
    if command == "auth":
        write_auth(args[0], int(args[1]))
    elif command == "replace":
        asyncio.run(replace(int(args[0]), int(args[1])))
    elif command == "writes":
        asyncio.run(writes(int(args[0]), int(args[1])))
    elif command == "touch":
        asyncio.run(touch(int(args[0]), int(args[1])))
    elif command == "connections":
        asyncio.run(connections(int(args[0]), int(args[1]), int(args[2]), args[3]))
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()
