#!/usr/bin/env python3
"""Fails when an #include crosses one of the architecture's arrows.

The arrows (docs/ARCHITECTURE.md): rpc -> moe -> kernels -> base; plan, oracle
and platform build anywhere (no gRPC, CUDA or proto headers); the client
links proto, base, plan, oracle and platform only. Each rule names the files it
covers and the include prefixes they may not use. Run from anywhere:
    python3 scripts/check_layering.py
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ('.h', '.cc', '.cu', '.cuh')
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')

# (folder, forbidden include prefixes, why)
RULES = [
    ('base', ('server/', 'kernels/', 'client/', 'kplan/v1/', 'grpc', 'cuda', 'nccl'),
     'base is the bottom layer'),
    ('kernels', ('server/', 'client/', 'kplan/v1/', 'grpc', 'google/'),
     'kernels are plain launchers: raw pointers and sizes, no proto, gRPC or server code'),
    ('server/platform', ('grpc', 'kplan/v1/', 'google/', 'cuda', 'nccl', 'server/rpc/',
                         'server/moe/', 'kernels/'),
     'platform describes platforms; the device probers behind it link no kernels'),
    ('server/plan', ('grpc', 'kplan/v1/', 'google/', 'cuda', 'nccl', 'server/rpc/',
                     'server/moe/', 'server/ir/', 'kernels/'),
     'plan builds and tests anywhere'),
    ('server/oracle', ('grpc', 'kplan/v1/', 'google/', 'cuda', 'nccl', 'server/rpc/',
                       'server/moe/', 'server/ir/', 'kernels/'),
     'oracle builds and tests anywhere'),
    ('server/moe', ('grpc', 'server/rpc/', 'client/'), 'moe is below rpc'),
    ('server/ir', ('grpc', 'server/rpc/', 'server/moe/', 'client/'), 'ir is below rpc'),
    ('server/exec', ('grpc', 'server/rpc/', 'server/moe/', 'client/'), 'exec is below rpc'),
    ('client', ('server/moe/', 'server/ir/', 'server/exec/', 'kernels/', 'server/rpc/server',
                'server/rpc/service', 'server/rpc/call', 'server/rpc/moe_handlers'),
     'the client links proto, base, plan, oracle and platform only'),
]


def main():
    failures = []
    for folder, forbidden, why in RULES:
        top = os.path.join(ROOT, folder)
        if not os.path.isdir(top):
            continue
        for dirpath, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, ROOT)
                with open(path, encoding='utf-8', errors='replace') as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1).startswith(forbidden):
                            failures.append(f'{rel}:{number}: includes {m.group(1)} ({why})')
    for f in failures:
        print(f)
    if failures:
        print(f'check_layering: {len(failures)} include(s) against the arrows', file=sys.stderr)
        return 1
    print('check_layering: every include follows the arrows')
    return 0


if __name__ == '__main__':
    sys.exit(main())
