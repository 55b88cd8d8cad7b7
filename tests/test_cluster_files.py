"""The deployment files under cluster/ parse, reference existing paths and current CLI names.

Docker, SLURM and Kubernetes are not available in CI, so these tests check what can be
checked without them: the YAML parses (PyYAML), every file a compose service mounts or a
Dockerfile copies exists, commands use the current ``dask scheduler`` / ``dask worker``
names, the Dask TLS configs yield working SSL contexts, ports stay private, GPU workers
get distinct devices, and the certificate script produces a valid chain.
"""

from __future__ import annotations

import ast
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"
sys.path.insert(0, str(CLUSTER))

from make_certs import make_certificates  # noqa: E402  (cluster/ is not a package)

ROLES = ("scheduler", "worker", "client")
CONTAINER_TLS_DIR = "/etc/gtopk-lab/tls"
#: Names removed in distributed 2026.6 (see /work/shared/ecosystem.md).
OLD_CLI = re.compile(r"(?<![\w.-])dask-(scheduler|worker)(?![\w-])")

pytestmark = pytest.mark.timeout(60)


def _compose() -> dict:
    return yaml.safe_load((CLUSTER / "docker-compose.yml").read_text())


def _text_files() -> list[Path]:
    return [p for p in CLUSTER.rglob("*") if p.is_file() and "certs" not in p.parts
            and p.suffix in {"", ".yml", ".yaml", ".sh", ".py", ".md", ".dockerignore"}]


# --- docker-compose ---------------------------------------------------------------------------

def test_compose_has_scheduler_workers_and_jupyter_with_current_cli() -> None:
    services = _compose()["services"]
    assert {"scheduler", "worker", "jupyter"} <= set(services)
    sched = services["scheduler"]["command"]
    assert sched[:2] == ["dask", "scheduler"]
    assert sched[sched.index("--protocol") + 1] == "tls"
    for name, svc in services.items():
        if name == "worker" or name.startswith("gpu-worker-"):
            cmd = svc["command"]
            assert cmd[:3] == ["dask", "worker", "tls://scheduler:8786"], name
            assert cmd[cmd.index("--nthreads") + 1] == "1"
            # GPU=1 tells gtopk-lab the worker owns a GPU: only GPU workers may claim it.
            if name.startswith("gpu-worker-"):
                assert cmd[cmd.index("--resources") + 1] == "GPU=1"
            else:
                assert "--resources" not in cmd
            assert "NET_ADMIN" in svc["cap_add"]
            assert svc["environment"]["GTOPK_SHAPE_BANDWIDTH"] == "${GTOPK_SHAPE_BANDWIDTH:-}"
    assert services["jupyter"]["command"][:2] == ["jupyter", "lab"]


def test_compose_build_and_mounts_reference_existing_paths() -> None:
    services = _compose()["services"]
    for name, svc in services.items():
        build = svc["build"]
        context = (CLUSTER / build["context"]).resolve()
        assert (context / "pyproject.toml").is_file(), name
        assert (context / build["dockerfile"]).is_file(), name
        assert build["args"]["VARIANT"] == "${GTOPK_VARIANT:-cpu}"
        for volume in svc.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("${"):  # user-chosen folder (data, results)
                continue
            path = (CLUSTER / source).resolve()
            if path.parent.name == "certs":  # written by make_certs.py, never committed
                assert path.name in {"ca.pem", *(f"{r}.pem" for r in ROLES),
                                     *(f"{r}-key.pem" for r in ROLES)}
                assert target.startswith(CONTAINER_TLS_DIR + "/")
                continue
            assert path.exists(), f"{name} mounts {source}, which does not exist"


def test_each_role_mounts_only_its_own_key_and_config() -> None:
    services = _compose()["services"]
    role_of = {"scheduler": "scheduler", "jupyter": "client"}
    for name, svc in services.items():
        role = role_of.get(name, "worker")
        keys = [v.split(":")[0] for v in svc["volumes"] if v.split(":")[0].endswith("-key.pem")]
        assert keys == [f"./certs/{role}-key.pem"], name
        assert f"./dask/{role}.yaml:/etc/dask/gtopk-tls.yaml:ro" in svc["volumes"]


def test_compose_publishes_nothing_beyond_host_loopback_and_never_8786() -> None:
    for name, svc in _compose()["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on all interfaces"
            assert not str(port).endswith(":8786"), f"{name} publishes the scheduler port"


def test_gpu_workers_reserve_distinct_single_gpus_in_the_gpu_profile() -> None:
    services = _compose()["services"]
    gpu = {n: s for n, s in services.items() if n.startswith("gpu-worker-")}
    assert len(gpu) >= 2
    ids = []
    for name, svc in gpu.items():
        assert svc["profiles"] == ["gpu"]
        (device,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert "count" not in device  # count: 1 hands every replica the same GPU
        (gpu_id,) = device["device_ids"]
        ids.append(gpu_id)
    assert len(set(ids)) == len(ids)
    assert "profiles" not in services["worker"]  # CPU workers start by default


# --- Dockerfile, scripts ------------------------------------------------------------------------

def test_dockerfile_builds_cpu_and_cuda_variants_from_existing_files() -> None:
    text = (CLUSTER / "Dockerfile").read_text()
    assert re.search(r"^ARG VARIANT=cpu$", text, re.M)
    assert re.search(r"^\s*cpu\)\s+index=", text, re.M) and re.search(r"^\s*cuda\)\s+index=", text, re.M)
    torch_pin = re.search(r"^ARG TORCH_VERSION=(\S+)$", text, re.M).group(1)
    make_pin = re.search(r"^TORCH\s*\?=\s*torch==(\S+)$", (REPO / "Makefile").read_text(), re.M)
    if make_pin:
        assert torch_pin == make_pin.group(1), "Dockerfile and Makefile pin different torch versions"
    for src in re.findall(r"/opt/gtopk-lab/src/(cluster/\S+)", text):
        assert (REPO / src).is_file(), src
    assert "ENTRYPOINT" in text and "entrypoint.sh" in text
    ignore = (CLUSTER / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignore and "cluster/certs" in ignore


@pytest.mark.parametrize("script", ["entrypoint.sh", "shape-traffic.sh"])
def test_shell_scripts_parse_and_are_executable(script: str) -> None:
    path = CLUSTER / script
    assert path.stat().st_mode & stat.S_IXUSR
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, res.stderr


def test_no_removed_cli_names_anywhere_in_cluster_files() -> None:
    offenders = [f"{p.relative_to(REPO)}: {m.group(0)}"
                 for p in _text_files() for m in OLD_CLI.finditer(p.read_text())]
    assert offenders == []


def test_readme_mentions_only_existing_cluster_paths() -> None:
    text = (CLUSTER / "README.md").read_text()
    paths = set(re.findall(r"\bcluster/[\w./-]+[\w]", text))
    assert paths, "README names no files"
    missing = [p for p in sorted(paths) if not (REPO / p).exists() and not p.startswith("cluster/certs")]
    assert missing == []


# --- Dask TLS configs ---------------------------------------------------------------------------

@pytest.mark.parametrize("role", ROLES)
def test_role_config_requires_tls_and_yields_an_ssl_context(role: str, tmp_path: Path) -> None:
    import dask
    from distributed.security import Security

    raw = (CLUSTER / "dask" / f"{role}.yaml").read_text()
    comm = yaml.safe_load(raw)["distributed"]["comm"]
    assert comm["require-encryption"] is True
    assert comm["tls"]["ca-file"] == f"{CONTAINER_TLS_DIR}/ca.pem"
    assert set(comm["tls"]) - {"ca-file", "min-version"} == {role}  # no other role's key
    certs = make_certificates(tmp_path / "certs")
    config = yaml.safe_load(raw.replace(CONTAINER_TLS_DIR, str(certs["ca"].parent)))

    def flat(d: dict, prefix: str = "") -> dict:
        out: dict = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    with dask.config.set(flat(config)):  # dotted keys: merge into, not replace, the defaults
        sec = Security()
    assert sec.require_encryption
    ctx = sec.get_connection_args(role)["ssl_context"]
    assert ctx is not None and ctx.verify_mode.name == "CERT_REQUIRED"
    if role != "client":
        assert sec.get_listen_args(role)["ssl_context"] is not None


# --- certificates ---------------------------------------------------------------------------------

def test_make_certs_writes_a_valid_chain_with_private_keys(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    paths = make_certificates(tmp_path / "c", sans=["scheduler", "10.0.0.5"])
    ca = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for role in ROLES:
        cert = x509.load_pem_x509_certificate(paths[role].read_bytes())
        assert cert.issuer == ca.subject
        ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes,
                               ec.ECDSA(cert.signature_hash_algorithm))
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "scheduler" in sans.get_values_for_type(x509.DNSName)
        assert stat.S_IMODE(paths[f"{role}_key"].stat().st_mode) == 0o600
    assert stat.S_IMODE(paths["ca_key"].stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        make_certificates(tmp_path / "c")
    make_certificates(tmp_path / "c", force=True, key_type="rsa")


@pytest.mark.parametrize("kwargs, fragment", [
    ({"valid_days": 0}, "valid_days=0"),
    ({"key_type": "dsa"}, "key_type='dsa'"),
    ({"sans": [""]}, "san=''"),
    ({"cluster_name": " "}, "cluster_name=' '"),
])
def test_make_certs_rejects_bad_input(kwargs: dict, fragment: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        make_certificates(tmp_path / "c", **kwargs)


def test_make_certs_cli_refuses_to_replace_a_ca(tmp_path: Path) -> None:
    cmd = [sys.executable, str(CLUSTER / "make_certs.py"), "--out", str(tmp_path / "c")]
    assert subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert second.returncode == 2 and "--force" in second.stderr


# --- HPC and Kubernetes -------------------------------------------------------------------------

def test_slurm_example_asks_one_gpu_per_single_threaded_worker() -> None:
    source = (CLUSTER / "slurm" / "slurm_cluster.py").read_text()
    tree = ast.parse(source)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "SLURMCluster"]
    assert len(calls) == 1
    kw = {k.arg: k.value for k in calls[0].keywords}
    assert ast.literal_eval(kw["worker_extra_args"]) == ["--resources", "GPU=1"]
    assert ast.literal_eval(kw["cores"]) == 1 and ast.literal_eval(kw["processes"]) == 1
    assert "job_extra_directives" in kw and "--gres=gpu:1" in source
    assert ast.literal_eval(kw["protocol"]) == "tls://"
    assert "job_extra=" not in source and "extra=" not in re.sub(r"\w+_extra\w*=", "", source)
    assert "dask-jobqueue==0.9.0" in source


def test_slurm_example_job_script_where_dask_jobqueue_is_installed(tmp_path: Path) -> None:
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed (HPC extra)")
    import argparse

    sys.path.insert(0, str(CLUSTER / "slurm"))
    import slurm_cluster

    certs = make_certificates(tmp_path / "certs")
    args = argparse.Namespace(tls_dir=str(certs["ca"].parent), venv="/opt/venv", job_cpus=4,
                              interface=None, gpu_type=None, partition="gpu", account="proj",
                              memory="32GB", walltime="01:00:00", dashboard_port=0,
                              log_dir=str(tmp_path / "logs"))
    cluster = slurm_cluster.build_cluster(args)
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "#SBATCH --gres=gpu:1" in script
    assert "--nthreads 1" in script and "--resources GPU=1" in script
    assert "/opt/venv/bin/python -m distributed.cli.dask_worker tls://" in script
    assert f"--tls-key {certs['worker_key']}" in script


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((CLUSTER / "kubernetes" / name).read_text()) if d]


def test_kubernetes_daskcluster_gives_each_worker_one_gpu_over_tls() -> None:
    docs = {d["kind"]: d for d in _docs("daskcluster.yaml")}
    dc = docs["DaskCluster"]
    assert dc["apiVersion"] == "kubernetes.dask.org/v1"
    name = dc["metadata"]["name"]
    (worker,) = dc["spec"]["worker"]["spec"]["containers"]
    args = worker["args"]
    assert args[:3] == ["dask", "worker", f"tls://{name}-scheduler:8786"]
    assert args[args.index("--nthreads") + 1] == "1"
    assert args[args.index("--resources") + 1] == "GPU=1"
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    (sched,) = dc["spec"]["scheduler"]["spec"]["containers"]
    assert sched["args"][:4] == ["dask", "scheduler", "--protocol", "tls"]
    assert dc["spec"]["scheduler"]["service"]["type"] == "ClusterIP"
    dask_files = {p.name for p in (CLUSTER / "dask").glob("*.yaml")}
    for pod, role in ((dc["spec"]["worker"]["spec"], "worker"), (dc["spec"]["scheduler"]["spec"], "scheduler")):
        mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["dask-config"]["subPath"] == f"{role}.yaml" in dask_files
        assert mounts["tls"]["mountPath"] == CONTAINER_TLS_DIR
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["tls"]["secret"]["secretName"] == f"gtopk-lab-tls-{role}"
    policy = docs["NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"dask.org/cluster-name": name}


def test_kubernetes_jupyter_pod_is_a_tls_client_admitted_by_the_policy() -> None:
    (pod,) = _docs("jupyter.yaml")
    assert pod["metadata"]["labels"]["gtopk-lab/client"] == "true"
    (container,) = pod["spec"]["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["dask-config"]["subPath"] == "client.yaml"
    assert {v["name"]: v for v in pod["spec"]["volumes"]}["tls"]["secret"]["secretName"] == "gtopk-lab-tls-client"
    assert container["args"][:2] == ["jupyter", "lab"]


def test_kubernetes_and_compose_commands_are_valid_shell_words() -> None:
    # A command list must survive shlex round-trips (no stray quoting that a shell would eat).
    for svc in _compose()["services"].values():
        assert shlex.split(shlex.join(svc["command"])) == svc["command"]
