#!/usr/bin/env python3
"""Renders every kustomize overlay in deploy/ and checks what operators rely
on: gRPC (or socket) health probes, a GPU limit (eight for the expert-parallel
overlay, whose GPUs form one group), a memory-backed /dev/shm,
a grace period above the server's --exit_timeout, resource requests, a
non-root user; the standalone Service is headless; the sidecar is a native
sidecar sharing its socket with the engine. Also lints the Dockerfile for the
rules the project keeps (multi-stage, the README's build scripts, non-root,
EXPOSE, HEALTHCHECK, labels). Without kubectl the overlays are checked from
their source files only (rendering is reported as skipped)."""
import os
import re
import shutil
import subprocess
import sys
import unittest

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")


def render(overlay):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return None
    out = subprocess.run([kubectl, "kustomize", os.path.join(DEPLOY, "overlays", overlay)],
                         check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def kplan_containers(docs):
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        spec = d["spec"]["template"]["spec"]
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if c["name"] == "kplan-server":
                yield d, spec, c


def seconds(arg):
    m = re.fullmatch(r"--exit_timeout=(\d+)s", arg)
    return int(m.group(1)) if m else None


class OverlayTest(unittest.TestCase):
    def check_server(self, docs, gpus=1):
        found = list(kplan_containers(docs))
        self.assertEqual(len(found), 1, "exactly one kplan-server container")
        deployment, pod, c = found[0]
        timeouts = [s for s in map(seconds, c["args"]) if s is not None]
        self.assertEqual(len(timeouts), 1, "--exit_timeout=Ns is set")
        self.assertGreater(pod["terminationGracePeriodSeconds"], timeouts[0])
        for probe in ("livenessProbe", "readinessProbe"):
            self.assertIn(probe, c)
            self.assertTrue("grpc" in c[probe] or "exec" in c[probe], probe)
        self.assertEqual(c["resources"]["limits"]["nvidia.com/gpu"], gpus)
        self.assertEqual(c["resources"]["requests"]["nvidia.com/gpu"], gpus)
        self.assertIn("cpu", c["resources"]["requests"])
        self.assertIn("memory", c["resources"]["requests"])
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        shm = [n for n, p in mounts.items() if p == "/dev/shm"]
        self.assertEqual(len(shm), 1)
        self.assertEqual(volumes[shm[0]]["emptyDir"]["medium"], "Memory")
        self.assertTrue(pod["securityContext"]["runAsNonRoot"])
        self.assertTrue(any(e["name"] == "NCCL_NVLS_ENABLE" and e["value"] == "0"
                            for e in c.get("env", [])))
        self.assertTrue(c["image"].startswith("kplan:"), c["image"])
        return deployment, pod, c

    def test_standalone(self):
        docs = render("standalone")
        if docs is None:
            self.skipTest("kubectl not installed: overlay not rendered")
        _, _, c = self.check_server(docs)
        self.assertEqual(c["readinessProbe"]["grpc"]["service"], "kplan.v1.KernelPlanService")
        services = [d for d in docs if d["kind"] == "Service"]
        self.assertEqual(len(services), 1)
        self.assertEqual(services[0]["spec"]["clusterIP"], "None")
        ports = {p["name"]: p["port"] for p in services[0]["spec"]["ports"]}
        self.assertEqual(ports, {"grpc": 50051, "metrics": 9464})

    def test_expert_parallel(self):
        docs = render("expert-parallel")
        if docs is None:
            self.skipTest("kubectl not installed: overlay not rendered")
        deployment, _, c = self.check_server(docs, gpus=8)
        self.assertIn("--devices=all", c["args"])  # the pod's GPUs form the group
        self.assertEqual(deployment["spec"]["replicas"], 1)

    def test_sidecar(self):
        docs = render("sidecar")
        if docs is None:
            self.skipTest("kubectl not installed: overlay not rendered")
        self.assertEqual([d["kind"] for d in docs], ["Deployment"])
        _, pod, c = self.check_server(docs)
        self.assertEqual(c["restartPolicy"], "Always")  # native sidecar
        listen = [a for a in c["args"] if a.startswith("--listen=")][0]
        self.assertTrue(listen.startswith("--listen=unix:"))
        sock_dir = os.path.dirname(listen[len("--listen=unix:"):])
        engine = [x for x in pod["containers"] if x["name"] != "kplan-server"]
        self.assertEqual(len(engine), 1)
        self.assertIn(sock_dir, [m["mountPath"] for m in engine[0]["volumeMounts"]])
        self.assertIn(sock_dir, [m["mountPath"] for m in c["volumeMounts"]])

    def test_sources_parse(self):
        for dirpath, _, files in os.walk(DEPLOY):
            for f in files:
                if f.endswith(".yaml"):
                    with open(os.path.join(dirpath, f)) as fh:
                        for doc in yaml.safe_load_all(fh):
                            self.assertIsInstance(doc, dict, f)


class DockerfileTest(unittest.TestCase):
    def test_rules(self):
        with open(os.path.join(ROOT, "Dockerfile")) as fh:
            text = fh.read()
        lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
        froms = [l for l in lines if l.startswith("FROM ")]
        self.assertGreaterEqual(len(froms), 2, "multi-stage")
        self.assertIn("AS build", froms[0])
        self.assertIn("scripts/install-deps.sh", text)
        self.assertIn("scripts/build.sh", text)
        self.assertIn("COPY --from=build", text)
        users = [l for l in lines if l.startswith("USER ")]
        self.assertTrue(users and users[-1] not in ("USER root", "USER 0"), "runs as non-root")
        self.assertTrue(any(l.startswith("EXPOSE ") and "50051" in l and "9464" in l for l in lines))
        self.assertTrue(any(l.startswith("HEALTHCHECK ") for l in lines))
        self.assertIn("org.opencontainers.image.revision", text)
        self.assertIn("ARG KPLAN_CUDA", text)
        for l in lines:
            self.assertFalse(re.search(r"\b(curl|wget)\b", l), "nothing downloaded: " + l)


if __name__ == "__main__":
    unittest.main(verbosity=2)
