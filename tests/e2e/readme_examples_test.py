#!/usr/bin/env python3
"""Every example in README.md runs, or says why it cannot here.

Each fenced sh, python or cpp block of the README is preceded by a marker
line, an HTML comment that Markdown does not show:

    <!-- example NAME: run -->            run here, must exit 0
    <!-- example NAME: serve -->          a server: must start listening, then
                                          stop on SIGTERM with exit status 0
    <!-- example NAME: skip REASON -->    not run here, and why (a GPU, Docker,
                                          Kubernetes, a recursive build)

A block without a marker fails the test, and so does a marked block that
disappears or appears: EXPECTED below is the list of examples, so changing
the README's examples means changing it too.

The runnable blocks run with bash (set -e, so each line must succeed), in a
scratch folder holding the fixtures the examples name (request.json, the
safetensors files under models/), with `kplan` on PATH and /usr/bin's python3
first, against a CPU-path kplan-server started here with --model_root=models
and --allow_shared_memory.
Two spellings of the deployment are rewritten for that server: localhost:50051
(and KPLAN_SERVER) is its address and /models/ its model root; a serve
example's 0.0.0.0:50051 becomes 127.0.0.1:0.

    readme_examples_test.py SOURCE_DIR BIN_DIR
"""
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

EXPECTED = {
    "demo": "skip",
    "test": "skip",
    "build": "skip",
    "cli-resolve": "run",
    "cli-experts": "run",
    "server": "serve",
    "ep-hosts": "skip",
    "cpp-client": "skip",
    "python-client": "skip",
    "python-example": "run",
    "docker": "skip",
    "kubernetes": "skip",
    "sanitizers": "skip",
}

MARKER = re.compile(r"^\s*<!-- example ([a-z0-9-]+): (run|serve|skip)\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^\s*```(\w*)\s*$")


def parse(readme):
    """[(name, kind, reason, language, code)] of the README's fenced blocks;
    raises on a block of sh/python/cpp without a marker."""
    lines = open(readme, encoding="utf-8").read().splitlines()
    blocks, marker, i = [], None, 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m:
            marker = m.groups()
            i += 1
            continue
        f = FENCE.match(lines[i])
        if f:
            language, start = f.group(1), i + 1
            i += 1
            while i < len(lines) and not FENCE.match(lines[i]):
                i += 1
            code = "\n".join(lines[start:i])
            if language in ("sh", "bash", "console", "python", "cpp"):
                if marker is None:
                    raise SystemExit(f"README.md:{start}: a ```{language} block without an "
                                     "<!-- example NAME: run|serve|skip REASON --> line above it")
                blocks.append((marker[0], marker[1], marker[2], language, code))
            marker = None
        elif lines[i].strip():
            marker = None  # a marker belongs to the block right below it
        i += 1
    return blocks


def bf16(a):
    """float32 -> bfloat16 bits (truncated), as uint16."""
    return (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        data = bf16(a).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def make_fixtures(work):
    """The files the examples name: request.json, and under models/ a stacked
    f.safetensors (l3.w13_weight, l3.w2_weight) and a two-shard checkpoint m/
    holding per-expert layers 3 and 5 (8 experts, H=512, I=256)."""
    with open(os.path.join(work, "request.json"), "w") as f:
        json.dump({"kernel_config": {"moe_backend": "triton"},
                   "model": {"architectures": ["MixtralForCausalLM"]}}, f)
    models = os.path.join(work, "models")
    os.makedirs(os.path.join(models, "m"))
    rng = np.random.default_rng(0)
    e, h, i = 8, 512, 256
    write_safetensors(os.path.join(models, "f.safetensors"), {
        "l3.w13_weight": rng.normal(0, 0.05, (e, 2 * i, h)),
        "l3.w2_weight": rng.normal(0, 0.05, (e, h, i))})
    weight_map = {}
    for shard, layer in (("model-00001-of-00002.safetensors", 3),
                         ("model-00002-of-00002.safetensors", 5)):
        tensors = {}
        for x in range(e):
            for proj, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)),
                                ("down_proj", (h, i))):
                name = f"model.layers.{layer}.mlp.experts.{x}.{proj}.weight"
                tensors[name] = rng.normal(0, 0.05, shape)
                weight_map[name] = shard
        write_safetensors(os.path.join(models, "m", shard), tensors)
    with open(os.path.join(models, "m", "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return models


def start_server(bin_dir, models, work):
    log = open(os.path.join(work, "server.log"), "w+")
    proc = subprocess.Popen([os.path.join(bin_dir, "kplan-server"), "--listen=127.0.0.1:0",
                             "--devices=none", "--exit_timeout=5s", f"--model_root={models}",
                             "--allow_shared_memory"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline:
        log.seek(0)
        m = re.search(r"\(port (\d+)", log.read())
        if m:
            return proc, f"127.0.0.1:{m.group(1)}"
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("kplan-server did not start:\n" + open(log.name).read())


def serve(name, code, env, work):
    """A server example: it must listen, then exit 0 on SIGTERM."""
    command = code.replace("0.0.0.0:50051", "127.0.0.1:0")
    log_path = os.path.join(work, f"{name}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=work, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        listening = False
        while time.time() < deadline and proc.poll() is None:
            if "listening on" in open(log_path).read():
                listening = True
                break
            time.sleep(0.1)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    output = open(log_path).read()
    return (0 if listening and rc == 0 else 1), output


def main():
    src, bin_dir = sys.argv[1], os.path.abspath(sys.argv[2])
    blocks = parse(os.path.join(src, "README.md"))
    failures = []
    names = [b[0] for b in blocks]
    for name in sorted(set(names)):
        if names.count(name) > 1:
            failures.append(f"example {name}: marked more than once")
    found = {b[0]: b[1] for b in blocks}
    for name, kind in EXPECTED.items():
        if name not in found:
            failures.append(f"example {name}: its marked block disappeared from README.md")
        elif found[name] != kind:
            failures.append(f"example {name}: marked {found[name]}, expected {kind}")
    for name in found.keys() - EXPECTED.keys():
        failures.append(f"example {name}: new in README.md; add it to EXPECTED in this test")
    for name, kind, reason, _, _ in blocks:
        if kind == "skip" and not reason:
            failures.append(f"example {name}: skipped without a reason")

    with tempfile.TemporaryDirectory() as work:
        os.symlink(os.path.dirname(bin_dir), os.path.join(work, "build"))  # build/bin/...
        os.symlink(os.path.join(src, "client"), os.path.join(work, "client"))
        models = make_fixtures(work)
        server, addr = start_server(bin_dir, models, work)
        env = dict(os.environ, KPLAN_SERVER=addr,
                   PATH=f"{bin_dir}:/usr/bin:/bin:{os.environ.get('PATH', '')}")
        env.pop("PYTHONPATH", None)
        try:
            for name, kind, reason, language, code in blocks:
                if kind == "skip":
                    print(f"--- {name}: skipped: {reason}")
                    continue
                if kind == "serve":
                    rc, output = serve(name, code, env, work)
                else:
                    script = "set -euo pipefail\n" + code.replace(
                        "localhost:50051", addr).replace("/models/", models + "/")
                    run = subprocess.run(["bash", "-c", script], cwd=work, env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, timeout=300)
                    rc, output = run.returncode, run.stdout
                print(f"--- {name}: {kind}, exit {rc}\n{output}")
                if rc != 0:
                    failures.append(f"example {name}: exit {rc}")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    if failures:
        print("\n".join(["FAILED:"] + failures))
        return 1
    print(f"readme_examples_test: ok ({len(blocks)} examples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
