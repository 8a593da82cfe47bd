#!/usr/bin/env python3
"""A cache-aware proxy: each request goes to the instance that holds the
longest prefix of its prompt, as the Conductor KV indexer reports it.

    python examples/conductor_proxy.py --conductor http://127.0.0.1:13333 \
        --model qwen --block-size 16 \
        --backend vllm-1=http://10.0.0.5:8000 --backend vllm-2=http://10.0.0.6:8000 \
        [--tokenizer Qwen/Qwen2.5-7B-Instruct] [--port 8080]

POST /v1/completions and /v1/chat/completions are forwarded unchanged. The
prompt's token ids come from the body's `prompt_token_ids` (or a `prompt`
that is a list of ids), else from `--tokenizer` (needs `transformers`).
Instance names are the `instance_id`s the engines were registered under.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mooncake.conductor import ConductorClient, ConductorError


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conductor", default="http://127.0.0.1:13333")
    ap.add_argument("--model", required=True, help="the model name registered with the Conductor")
    ap.add_argument("--block-size", type=int, required=True)
    ap.add_argument("--backend", action="append", required=True, help="instance_id=http://host:port")
    ap.add_argument("--tokenizer", help="a Hugging Face tokenizer for text prompts")
    ap.add_argument("--conductor-timeout", type=float, default=1.0,
                    help="seconds to wait for the Conductor before falling back to round robin")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8080)
    args = ap.parse_args()

    backends = dict(b.split("=", 1) for b in args.backend)
    conductor = ConductorClient(args.conductor, timeout=args.conductor_timeout)
    round_robin = itertools.cycle(sorted(backends))
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)

    def token_ids(body: dict) -> list:
        if isinstance(body.get("prompt_token_ids"), list):
            return body["prompt_token_ids"]
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        if tokenizer is None:
            return []
        if "messages" in body:
            return tokenizer.apply_chat_template(body["messages"], tokenize=True, add_generation_prompt=True)
        return tokenizer.encode(prompt if isinstance(prompt, str) else "")

    def choose(body: dict) -> str:
        ids = token_ids(body)
        if ids:
            try:
                name, hit = conductor.best_instance(args.model, ids, args.block_size, candidates=backends)
                if name is not None and hit["longest_matched"] > 0:
                    return name
            except ConductorError as e:
                print(f"conductor: {e}; falling back to round robin", file=sys.stderr)
        # No instance holds any of the prompt: spread the load.
        return next(round_robin)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self.send_error(400, "body is not JSON")
                return
            name = choose(body)
            req = urllib.request.Request(backends[name] + self.path, data=raw, method="POST")
            req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    status, payload, ctype = r.status, r.read(), r.headers.get("Content-Type", "application/json")
            except urllib.error.HTTPError as e:
                status, payload, ctype = e.code, e.read(), "application/json"
            except OSError as e:
                self.send_error(502, f"{name}: {e}")
                return
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("X-Routed-To", name)
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"conductor proxy listening on {args.host}:{args.port} -> {', '.join(sorted(backends))}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
