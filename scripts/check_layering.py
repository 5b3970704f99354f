#!/usr/bin/env python3
"""Fails when an #include crosses one of the architecture's arrows.

The arrows (docs/ARCHITECTURE.md, README's folder table): server/rpc ->
server/moe -> kernels -> base, and server -> resolve -> base; base is the
bottom layer (absl, OpenSSL and the standard library only). resolve/ is the
planning half: resolve/plan, resolve/oracle and resolve/platform build
anywhere (no gRPC, CUDA or proto headers, nothing from kernels, server or
client); resolve/proto converts between the kplan.v1 messages and them
(ResolveKernelConfig), proto headers but no gRPC, kernels or server. kernels
include nothing from resolve, server or client. The client library links
proto and base; the CLI adds resolve/ (kplan_resolve), never server/ or
kernels/.

Each rule names the folder it covers, the include prefixes its files may not
use, and the prefixes allowed although a forbidden one matches (the more
specific wins). A file may also be exempt from a prefix (EXEMPT) where the
build confines it: the CUDA device prober is the one file of resolve/platform
that sees CUDA headers, in its own library (kplan_device_probe).
scripts/test.sh runs this first, so CI fails on a violation. Run from anywhere:
    python3 scripts/check_layering.py
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ('.h', '.cc', '.cu', '.cuh')
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')

# Headers of the wire and of the accelerators, for the rules below.
PROTO = ('kplan/v1/', 'google/', 'grpc')
ACCEL = ('cuda', 'nccl', 'cub/', 'thrust/')

# (folder, forbidden include prefixes, allowed prefixes, why)
RULES = [
    ('base', ('resolve/', 'server/', 'kernels/', 'client/', 'tests/') + PROTO + ACCEL, (),
     'base is the bottom layer: absl, OpenSSL and the standard library only'),
    ('kernels', ('resolve/', 'server/', 'client/') + PROTO, (),
     'kernels are plain launchers: raw pointers and sizes, no proto, gRPC, planning or '
     'server code'),
    ('resolve/platform', PROTO + ACCEL + ('resolve/', 'server/', 'kernels/', 'client/'),
     ('resolve/platform/',),
     'platform describes platforms; only base below it, no kernels'),
    ('resolve/plan', PROTO + ACCEL + ('resolve/', 'server/', 'kernels/', 'client/'),
     ('resolve/plan/', 'resolve/platform/'),
     'plan builds and tests anywhere (platform and base only)'),
    ('resolve/oracle', PROTO + ACCEL + ('resolve/', 'server/', 'kernels/', 'client/'),
     ('resolve/oracle/', 'resolve/plan/', 'resolve/platform/'),
     'oracle builds and tests anywhere (plan, platform and base only)'),
    ('resolve/proto', ('grpc', 'server/', 'kernels/', 'client/') + ACCEL, (),
     'resolve/proto converts messages for the planning half: proto, resolve and base, '
     'no gRPC, CUDA, kernels or server'),
    ('server/ir', ('grpc', 'server/rpc/', 'server/moe/', 'client/'), (), 'ir is below rpc'),
    ('server/exec', ('grpc', 'server/rpc/', 'server/moe/', 'client/'), (), 'exec is below rpc'),
    ('server/moe', ('grpc', 'server/rpc/', 'client/'), (), 'moe is below rpc'),
    ('client/cpp', ('resolve/', 'server/', 'kernels/'), (),
     'the client library links proto and base only'),
    ('client', ('server/', 'kernels/'), (),
     'the CLI plans offline through proto, base and resolve/ (kplan_resolve) only, never '
     'kernels or the execution stack'),
]

# (file, prefixes it may include although its folder's rule forbids them)
EXEMPT = {
    'resolve/platform/cuda_device_prober.cc': ('cuda',),
}


def covered(rel, folder):
    return rel == folder or rel.startswith(folder + '/')


def main():
    failures = []
    for dirpath, dirnames, files in os.walk(ROOT):
        dirnames[:] = sorted(d for d in dirnames
                             if not d.startswith('.') and not d.startswith('build'))
        for name in sorted(files):
            if not name.endswith(SOURCES):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, ROOT).replace(os.sep, '/')
            rules = [r for r in RULES if covered(rel, r[0])]
            if not rules:
                continue
            exempt = EXEMPT.get(rel, ())
            with open(path, encoding='utf-8', errors='replace') as f:
                lines = f.readlines()
            for number, line in enumerate(lines, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                if inc.startswith(exempt):
                    continue
                for _, forbidden, allowed, why in rules:
                    if inc.startswith(forbidden) and not inc.startswith(allowed):
                        failures.append(f'{rel}:{number}: includes {inc} ({why})')
                        break
    for f in failures:
        print(f)
    if failures:
        print(f'check_layering: {len(failures)} include(s) against the arrows', file=sys.stderr)
        return 1
    print('check_layering: every include follows the arrows')
    return 0


if __name__ == '__main__':
    sys.exit(main())
