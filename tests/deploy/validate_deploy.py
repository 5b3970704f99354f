#!/usr/bin/env python3
"""Renders every kustomize overlay in deploy/ and checks what operators rely
on: gRPC (or socket) health probes, a GPU limit (eight for the expert-parallel
overlay, whose GPUs form one group), a memory-backed /dev/shm,
a grace period above the server's --exit_timeout, resource requests, a
non-root user; the standalone Service is headless; the sidecar is a native
sidecar sharing its socket with the engine, which asks for its own GPU; the
tls overlay takes its certificate and token from Secrets. Every pod meets
Pod Security "restricted" (checked on the rendered overlays and, kubectl or
not, on each source file that holds a whole Deployment), kplan runs with a
read-only root filesystem, /tmp on an emptyDir and a volume for the weights
under --model_root, with a preStop pause and a PodDisruptionBudget. Also lints the Dockerfile for the
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


# Pod Security Standards, "restricted" profile (Kubernetes 1.29).
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                   "persistentVolumeClaim", "projected", "secret"}


def restricted_violations(pod):
    """What in `pod` (a PodSpec) the "restricted" profile refuses."""
    out = []
    psc = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(key)
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"volume {v['name']}: {sorted(kinds - ALLOWED_VOLUMES)}")
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        csc = c.get("securityContext", {})
        name = c["name"]
        if csc.get("privileged"):
            out.append(f"{name}: privileged")
        if csc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = csc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{name}: capabilities.drop must include ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities {caps['add']}")
        if not csc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            out.append(f"{name}: runAsNonRoot")
        if csc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = csc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile RuntimeDefault or Localhost")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{name}: hostPort")
    return out


def deployments_in(docs):
    return [d for d in docs if d and d.get("kind") == "Deployment"]


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
        # A preStop pause lets endpoints drop the pod first; a native sidecar is
        # stopped only after the engine's own pause and exit.
        sidecar = c.get("restartPolicy") == "Always"
        pause = max(x.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
                    for x in pod["containers"] + [c])
        if not sidecar:
            self.assertGreater(c["lifecycle"]["preStop"]["sleep"]["seconds"], 0)
        self.assertGreater(pod["terminationGracePeriodSeconds"], timeouts[0] + pause)
        self.assertEqual(restricted_violations(pod), [])
        sc = c["securityContext"]
        self.assertTrue(sc["readOnlyRootFilesystem"])
        self.assertNotEqual(sc.get("runAsUser", 0), 0)
        self.assertNotIn("runAsUser", pod["securityContext"], "set per container")
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
        tmp = [n for n, p in mounts.items() if p == "/tmp"]
        self.assertEqual(len(tmp), 1, "a writable /tmp beside the read-only root")
        self.assertIn("emptyDir", volumes[tmp[0]])
        roots = [a[len("--model_root="):] for a in c["args"] if a.startswith("--model_root=")]
        self.assertEqual(len(roots), 1, "--model_root names the weights volume")
        weights = [n for n, p in mounts.items() if p == roots[0]]
        self.assertEqual(len(weights), 1, roots[0])
        self.assertIn("persistentVolumeClaim", volumes[weights[0]])
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
        pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
        self.assertEqual(len(pdbs), 1)
        deployment = deployments_in(docs)[0]
        self.assertEqual(pdbs[0]["spec"]["selector"]["matchLabels"],
                         deployment["spec"]["selector"]["matchLabels"])

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
        # The device plugin gives GPUs per container: the engine asks for its own.
        self.assertEqual(engine[0]["resources"]["limits"]["nvidia.com/gpu"], 1)
        self.assertEqual(engine[0]["resources"]["requests"]["nvidia.com/gpu"], 1)
        self.assertNotEqual(engine[0]["securityContext"].get("runAsUser"),
                            c["securityContext"]["runAsUser"], "the engine's user is its own")
        self.assertIn(sock_dir, [m["mountPath"] for m in engine[0]["volumeMounts"]])
        self.assertIn(sock_dir, [m["mountPath"] for m in c["volumeMounts"]])

    def test_tls(self):
        docs = render("tls")
        if docs is None:
            self.skipTest("kubectl not installed: overlay not rendered")
        _, pod, c = self.check_server(docs)
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        self.assertEqual(sorted(secrets.values()), ["kplan-tls", "kplan-token"])
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        files = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in c["args"] if "=" in a}
        for flag, secret in (("--tls_cert", "tls"), ("--tls_key", "tls"),
                             ("--auth_token_file", "token")):
            self.assertEqual(os.path.dirname(files[flag]), mounts[secret], flag)
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            command = c[probe]["exec"]["command"]  # gRPC probes cannot do TLS
            self.assertEqual(command[:2], ["kplan", "health"])
            self.assertIn("--tls-ca", command)

    def test_pod_security_restricted_in_sources(self):
        # Each source file holding a whole Deployment, read directly (no kubectl).
        checked = 0
        for dirpath, _, files in os.walk(DEPLOY):
            for f in sorted(files):
                if not f.endswith(".yaml") or f == "kustomization.yaml":
                    continue
                with open(os.path.join(dirpath, f)) as fh:
                    for d in deployments_in(yaml.safe_load_all(fh)):
                        checked += 1
                        self.assertEqual(restricted_violations(d["spec"]["template"]["spec"]),
                                         [], f)
        self.assertEqual(checked, 2, "base/deployment.yaml and overlays/sidecar/engine.yaml")

    def test_the_restricted_check_catches(self):
        pod = {"securityContext": {"runAsNonRoot": True,
                                   "seccompProfile": {"type": "RuntimeDefault"}},
               "containers": [{"name": "c", "securityContext": {
                   "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}
        self.assertEqual(restricted_violations(pod), [])
        bad = yaml.safe_load(yaml.safe_dump(pod))
        bad["containers"][0]["securityContext"]["capabilities"] = {"drop": ["NET_RAW"]}
        bad["volumes"] = [{"name": "h", "hostPath": {"path": "/"}}]
        del bad["securityContext"]["seccompProfile"]
        self.assertEqual(len(restricted_violations(bad)), 3)

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
