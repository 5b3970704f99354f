#!/usr/bin/env python3
"""Renders every kustomize overlay in deploy/ and checks what operators rely
on: gRPC (or socket) health probes, a GPU limit for every container that
computes (eight for the expert-parallel overlay, whose GPUs form one group), a
memory-backed /dev/shm, a grace period above preStop plus the server's
--exit_timeout, resource requests, the weight volume mounted read-only, the
Pod Security "restricted" profile on every pod; the standalone Service is
headless with a PodDisruptionBudget; the secure overlay takes TLS and the token
from Secrets; the sidecar is a native sidecar sharing its socket with the
engine. Also lints the Dockerfile for the rules the project keeps (multi-stage,
packages installed before the sources are copied, the README's build scripts,
CUDA architectures as a build argument, non-root, EXPOSE, HEALTHCHECK on the
configured port, labels).

With kubectl the overlays are rendered by `kubectl kustomize`; without it
(Debian's kubernetes-client is too old for these kustomizations) by
render_lite() below, which knows exactly the kustomize features deploy/ uses:
resources, inline JSON6902 patches with a target (python3-jsonpatch),
`$patch: delete`, labels with includeSelectors, images. Anything else in a
kustomization fails the test rather than rendering wrongly."""
import os
import re
import shutil
import subprocess
import sys
import unittest

import jsonpatch
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")


KNOWN_KEYS = {"apiVersion", "kind", "resources", "patches", "labels", "images"}


def matches(doc, target):
    return (doc.get("kind") == target.get("kind", doc.get("kind")) and
            doc["metadata"]["name"] == target.get("name", doc["metadata"]["name"]))


def add_labels(doc, pairs, selectors):
    doc.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
    if not selectors:
        return
    spec = doc.get("spec", {})
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
        spec.setdefault("selector", {}).setdefault("matchLabels", {}).update(pairs)
        spec["template"].setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
    elif doc["kind"] == "Service":
        spec.setdefault("selector", {}).update(pairs)
    elif doc["kind"] == "PodDisruptionBudget":
        spec.setdefault("selector", {}).setdefault("matchLabels", {}).update(pairs)


def render_lite(directory):
    with open(os.path.join(directory, "kustomization.yaml")) as fh:
        k = yaml.safe_load(fh)
    unknown = set(k) - KNOWN_KEYS
    if unknown:
        raise AssertionError(f"{directory}: render_lite does not know {sorted(unknown)}")
    docs = []
    for r in k.get("resources", []):
        path = os.path.join(directory, r)
        if os.path.isdir(path):
            docs += render_lite(path)
        else:
            with open(path) as fh:
                docs += [d for d in yaml.safe_load_all(fh) if d]
    for p in k.get("patches", []):
        body = yaml.safe_load(p["patch"])
        if isinstance(body, list):  # JSON6902 on every target it names
            hits = [i for i, d in enumerate(docs) if matches(d, p["target"])]
            if not hits:
                raise AssertionError(f"{directory}: patch target {p['target']} matches nothing")
            for i in hits:
                docs[i] = jsonpatch.apply_patch(docs[i], body)
        elif body.get("$patch") == "delete":
            target = {"kind": body["kind"], "name": body["metadata"]["name"]}
            kept = [d for d in docs if not matches(d, target)]
            if len(kept) == len(docs):
                raise AssertionError(f"{directory}: delete of {target} matches nothing")
            docs = kept
        else:
            raise AssertionError(f"{directory}: render_lite knows only JSON6902 and delete patches")
    for entry in k.get("labels", []):
        for d in docs:
            add_labels(d, entry["pairs"], entry.get("includeSelectors", False))
    for image in k.get("images", []):
        for d in docs:
            spec = d.get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                name, _, _ = c["image"].partition(":")
                if name == image["name"]:
                    c["image"] = image.get("newName", name) + ":" + image["newTag"]
    return docs


def render(overlay):
    directory = os.path.join(DEPLOY, "overlays", overlay)
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return render_lite(directory)
    out = subprocess.run([kubectl, "kustomize", directory],
                         check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def pods(docs):
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield d, d["spec"]["template"]["spec"]


# Pod Security Standards, "restricted" (Kubernetes 1.25+): the fields it checks.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def restricted_violations(pod):
    bad = []
    psc = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            bad.append(key)
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {v['name']}: {sorted(kinds)}")
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            bad.append(f"{name}: capabilities.drop must hold ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: capabilities.add beyond NET_BIND_SERVICE")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            bad.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            bad.append(f"{name}: runAsUser 0")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile RuntimeDefault or Localhost")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                bad.append(f"{name}: hostPort")
    return bad


def kplan_containers(docs):
    for d, spec in pods(docs):
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if c["name"] == "kplan-server":
                yield d, spec, c


def seconds(arg):
    m = re.fullmatch(r"--exit_timeout=(\d+)s", arg)
    return int(m.group(1)) if m else None


def prestop_seconds(c):
    command = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return int(command[1]) if command[:1] == ["sleep"] else 0


OVERLAYS = sorted(os.listdir(os.path.join(DEPLOY, "overlays")))


class OverlayTest(unittest.TestCase):
    def check_server(self, docs, gpus=1):
        found = list(kplan_containers(docs))
        self.assertEqual(len(found), 1, "exactly one kplan-server container")
        deployment, pod, c = found[0]
        timeouts = [s for s in map(seconds, c["args"]) if s is not None]
        self.assertEqual(len(timeouts), 1, "--exit_timeout=Ns is set")
        self.assertGreater(pod["terminationGracePeriodSeconds"], timeouts[0] + prestop_seconds(c))
        for probe in ("livenessProbe", "readinessProbe"):
            self.assertIn(probe, c)
            self.assertTrue("grpc" in c[probe] or "exec" in c[probe], probe)
        self.assertEqual(c["resources"]["limits"]["nvidia.com/gpu"], gpus)
        self.assertEqual(c["resources"]["requests"]["nvidia.com/gpu"], gpus)
        self.assertIn("cpu", c["resources"]["requests"])
        self.assertIn("memory", c["resources"]["requests"])
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        shm = [n for n, m in mounts.items() if m["mountPath"] == "/dev/shm"]
        self.assertEqual(len(shm), 1)
        self.assertEqual(volumes[shm[0]]["emptyDir"]["medium"], "Memory")
        # The root filesystem is read-only; /tmp and the weights are volumes,
        # the weights read-only and where --model_root points.
        self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
        self.assertIn("/tmp", [m["mountPath"] for m in mounts.values()])
        roots = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--model_root=")]
        self.assertEqual(len(roots), 1, "--model_root is set")
        weights = [m for m in mounts.values() if m["mountPath"] == roots[0]]
        self.assertEqual(len(weights), 1, "a volume is mounted at --model_root")
        self.assertTrue(weights[0].get("readOnly"), "weights are mounted read-only")
        self.assertIn("persistentVolumeClaim", volumes[weights[0]["name"]])
        claim = volumes[weights[0]["name"]]["persistentVolumeClaim"]["claimName"]
        self.assertIn(claim, [d["metadata"]["name"] for d in docs
                              if d["kind"] == "PersistentVolumeClaim"])
        self.assertTrue(any(e["name"] == "NCCL_NVLS_ENABLE" and e["value"] == "0"
                            for e in c.get("env", [])))
        self.assertTrue(c["image"].startswith("kplan:"), c["image"])
        return deployment, pod, c

    def test_restricted_pod_security(self):
        for overlay in OVERLAYS:
            with self.subTest(overlay=overlay):
                found = list(pods(render(overlay)))
                self.assertTrue(found)
                for d, pod in found:
                    self.assertEqual(restricted_violations(pod), [], d["metadata"]["name"])

    def test_restricted_check_can_fail(self):
        # The check itself: a pod that breaks each rule is caught.
        _, pod = next(pods(render("standalone")))
        c = pod["containers"][0]
        del c["securityContext"]["capabilities"]
        c["securityContext"]["runAsUser"] = 0
        pod["hostNetwork"] = True
        pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
        del pod["securityContext"]["seccompProfile"]
        bad = " ".join(restricted_violations(pod))
        for word in ("capabilities.drop", "runAsUser 0", "hostNetwork", "hostPath", "seccomp"):
            self.assertIn(word, bad)

    def test_standalone(self):
        docs = render("standalone")
        _, _, c = self.check_server(docs)
        self.assertEqual(c["readinessProbe"]["grpc"]["service"], "kplan.v1.KernelPlanService")
        self.assertGreater(prestop_seconds(c), 0, "preStop lets endpoints drop the pod first")
        services = [d for d in docs if d["kind"] == "Service"]
        self.assertEqual(len(services), 1)
        self.assertEqual(services[0]["spec"]["clusterIP"], "None")
        ports = {p["name"]: p["port"] for p in services[0]["spec"]["ports"]}
        self.assertEqual(ports, {"grpc": 50051, "metrics": 9464})
        deployment = [d for d in docs if d["kind"] == "Deployment"][0]
        pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
        self.assertEqual(len(pdbs), 1)
        self.assertLess(pdbs[0]["spec"]["minAvailable"], deployment["spec"]["replicas"])
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        for k, v in pdbs[0]["spec"]["selector"]["matchLabels"].items():
            self.assertEqual(pod_labels.get(k), v, "the PDB selects the server's pods")

    def test_secure(self):
        docs = render("secure")
        _, pod, c = self.check_server(docs)
        flags = dict(a.split("=", 1) for a in c["args"] if "=" in a)
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        for flag in ("--tls_cert", "--tls_key", "--auth_token_file"):
            directory = os.path.dirname(flags[flag])
            self.assertIn(mounts.get(directory), secrets, f"{flag} lives in a Secret volume")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            command = c[probe]["exec"]["command"]  # gRPC probes cannot speak TLS
            ca = command[command.index("--tls-ca") + 1]
            self.assertIn(mounts.get(os.path.dirname(ca)), secrets, probe)

    def test_monitoring(self):
        docs = render("monitoring")
        self.check_server(docs)
        monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
        self.assertEqual(len(monitors), 1)
        service = [d for d in docs if d["kind"] == "Service"][0]
        for k, v in monitors[0]["spec"]["selector"]["matchLabels"].items():
            self.assertEqual(service["metadata"]["labels"].get(k), v)
        self.assertIn(monitors[0]["spec"]["endpoints"][0]["port"],
                      [p["name"] for p in service["spec"]["ports"]])

    def test_expert_parallel(self):
        docs = render("expert-parallel")
        deployment, _, c = self.check_server(docs, gpus=8)
        self.assertIn("--devices=all", c["args"])  # the pod's GPUs form the group
        self.assertEqual(deployment["spec"]["replicas"], 1)

    def test_sidecar(self):
        docs = render("sidecar")
        self.assertEqual(sorted(d["kind"] for d in docs), ["Deployment", "PersistentVolumeClaim"])
        _, pod, c = self.check_server(docs)
        self.assertEqual(c["restartPolicy"], "Always")  # native sidecar
        listen = [a for a in c["args"] if a.startswith("--listen=")][0]
        self.assertTrue(listen.startswith("--listen=unix:"))
        sock_dir = os.path.dirname(listen[len("--listen=unix:"):])
        engine = [x for x in pod["containers"] if x["name"] != "kplan-server"]
        self.assertEqual(len(engine), 1)
        self.assertIn(sock_dir, [m["mountPath"] for m in engine[0]["volumeMounts"]])
        self.assertIn(sock_dir, [m["mountPath"] for m in c["volumeMounts"]])
        # Each container asks for its own GPU; kplan's user id is its own, not
        # the pod's (the engine's image brings its own non-root user).
        self.assertEqual(engine[0]["resources"]["limits"]["nvidia.com/gpu"], 1)
        self.assertNotIn("runAsUser", pod["securityContext"])
        self.assertEqual(c["securityContext"]["runAsUser"], 10001)

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
        # Packages are installed before the sources come in, so a source
        # change does not reinstall them.
        copy_all = [i for i, l in enumerate(lines) if re.match(r"COPY \. ", l)]
        install = [i for i, l in enumerate(lines) if "install-deps.sh" in l and l.startswith("RUN")]
        self.assertEqual(len(copy_all), 1)
        self.assertTrue(install and install[0] < copy_all[0], "install-deps runs before COPY . .")
        self.assertIn("ARG KPLAN_CUDA_ARCHITECTURES", text)
        self.assertIn("-DKPLAN_CUDA_ARCHITECTURES=${KPLAN_CUDA_ARCHITECTURES}", text)
        users = [l for l in lines if l.startswith("USER ")]
        self.assertTrue(users and users[-1] not in ("USER root", "USER 0"), "runs as non-root")
        self.assertTrue(any(l.startswith("EXPOSE ") and "50051" in l and "9464" in l for l in lines))
        health = re.findall(r"^HEALTHCHECK (?:.*\\\n)*.*$", text, re.M)
        self.assertEqual(len(health), 1)
        self.assertNotIn("50051", health[0], "the health check takes the port from the environment")
        self.assertIn("${KPLAN_PORT}", health[0])
        self.assertIn("org.opencontainers.image.revision", text)
        self.assertIn("ARG KPLAN_CUDA", text)
        for l in lines:
            self.assertFalse(re.search(r"\b(curl|wget)\b", l), "nothing downloaded: " + l)


if __name__ == "__main__":
    unittest.main(verbosity=2)
