"""tpu_scripts/setup.sh run for real against a fake `gcloud`: what it packs, and what each
worker then runs (in a folder standing for the worker's home, with fake Pythons on PATH)."""

import os
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASH = shutil.which("bash") or "/bin/bash"

FAKE_GCLOUD = f"""#!{BASH}
# Records each call; scp copies the tarball into $FAKE_HOME, ssh runs --command there.
printf '%s\\n' "$*" >> "$GCLOUD_LOG"
[[ -n "${{FAKE_HOME:-}}" ]] || exit 0
case "$4" in
  scp) cp "$5" "$FAKE_HOME/jaxrl-llm.tar.gz" ;;
  ssh) for a in "$@"; do [[ "$a" == --command=* ]] && cmd="${{a#--command=}}"; done
       cd "$FAKE_HOME" && HOME="$FAKE_HOME" PATH="$WORKER_PATH" {BASH} -c "$cmd" ;;
esac
"""

# A Python that answers --version, makes a "venv" (a copy of itself) and logs the rest.
FAKE_PYTHON = f"""#!{BASH}
printf '%s %s\\n' "$0" "$*" >> "$PY_LOG"
case "$1" in
  --version) echo "Python VERSION" ;;
  -m) if [[ "$2" == venv ]]; then d="${{@: -1}}"; mkdir -p "$d/bin"; cp "$0" "$d/bin/python"; fi ;;
esac
"""

SOURCE = ["pyproject.toml", "jaxrl_llm/__init__.py", "configs/x.gin", ".gitignore"]
JUNK = [
    ".venv/bin/python", ".venv-3.12/bin/python", ".venv-3.13/lib/x.py",
    "jaxrl_llm.egg-info/PKG-INFO", "jaxrl_llm/__pycache__/a.cpython-311.pyc",
    ".pytest_cache/v/x", ".ruff_cache/x", ".hypothesis/x", "runs/r1/metrics.jsonl",
]  # fmt: skip


def _write(path: Path, text: str = "x\n", mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _scratch_tree(root: Path) -> set[str]:
    """A checkout with the real tpu_scripts and the junk a developer's tree holds; returns
    the paths setup.sh must pack."""
    shutil.copytree(REPO / "tpu_scripts", root / "tpu_scripts")
    for rel in SOURCE + JUNK:
        _write(root / rel)
    shutil.copy(REPO / ".gitignore", root / ".gitignore")
    return set(SOURCE) | {f"tpu_scripts/{p.name}" for p in (root / "tpu_scripts").iterdir()}


def _fake_python(path: Path, version: str) -> None:
    _write(path, FAKE_PYTHON.replace("VERSION", version), 0o755)


@pytest.fixture
def slice_(tmp_path, monkeypatch):
    """PATH with the fake gcloud; a worker home; the worker's PATH (fakes + a few tools)."""
    bin_dir, worker_bin, tools = tmp_path / "bin", tmp_path / "wbin", tmp_path / "tools"
    _write(bin_dir / "gcloud", FAKE_GCLOUD, 0o755)
    worker_bin.mkdir()
    tools.mkdir()
    for tool in ("bash", "tar", "gzip", "mkdir", "cp", "cat", "rm", "chmod", "env", "sed"):
        if found := shutil.which(tool):
            (tools / tool).symlink_to(found)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("GCLOUD_LOG", str(tmp_path / "gcloud.log"))
    monkeypatch.setenv("PY_LOG", str(tmp_path / "py.log"))
    monkeypatch.setenv("WORKER_PATH", f"{worker_bin}:{tools}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def _setup(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(tree / "tpu_scripts" / "setup.sh"), "--name=rl"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def _packed(tmp: Path) -> set[str]:
    with tarfile.open(tmp / "rl-jaxrl-llm.tar.gz") as tar:
        return {m.name.removeprefix("./") for m in tar.getmembers() if m.isfile()}


def test_setup_packs_git_files_only(slice_):
    """Tracked files and new ones git does not ignore; not the .venv-3.12 / .venv-3.13 /
    egg-info / caches / runs a developer's tree holds, nor a tracked file deleted here."""
    tree = slice_ / "tree"
    want = _scratch_tree(tree)
    _write(tree / "gone.py")
    git = ["git", "-C", str(tree)]
    subprocess.run([*git, "init", "-q"], check=True, timeout=30)
    subprocess.run([*git, "add", "-A"], check=True, timeout=30)
    (tree / "gone.py").unlink()
    _write(tree / "configs" / "mine.gin")  # new, not yet added: a user's own config goes too
    r = _setup(tree)
    assert r.returncode == 0, r.stderr
    assert _packed(slice_) == want | {"configs/mine.gin"}


def test_setup_without_git_packs_the_tree_less_what_gitignore_names(slice_):
    tree = slice_ / "tree"
    want = _scratch_tree(tree)
    r = _setup(tree)
    assert r.returncode == 0, r.stderr
    assert _packed(slice_) == want


def test_worker_with_python_3_10_only_fails_naming_it(slice_, monkeypatch):
    """A TPU VM runtime on Ubuntu 22.04 has Python 3.10; without apt to add 3.11 setup stops
    with one line naming the Python it found, before any pip install."""
    tree = slice_ / "tree"
    _scratch_tree(tree)
    _fake_python(slice_ / "wbin" / "python3", "3.10.12")
    monkeypatch.setenv("FAKE_HOME", str(slice_ / "home"))
    r = _setup(tree)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "Python 3.10.12" in last and "3.11" in last, r.stderr
    assert "pip" not in (slice_ / "py.log").read_text()


def test_worker_installs_python_3_11_and_a_venv(slice_, monkeypatch):
    """python3 is 3.10: apt adds python3.11; the package goes into ~/jaxrl-llm/.venv made with
    it, and every pip and python call after that is the venv's."""
    tree = slice_ / "tree"
    _scratch_tree(tree)
    wbin = slice_ / "wbin"
    _fake_python(wbin / "python3", "3.10.12")
    _write(wbin / "sudo", f'#!{BASH}\n"$@"\n', 0o755)
    _write(wbin / "apt-get", f"""#!{BASH}
echo "apt-get $*" >> "$PY_LOG"
if [[ " $* " == *" install "* ]]; then
  cp "{wbin}/python3" "{wbin}/python3.11"; sed -i 's/3\\.10\\.12/3.11.0/' "{wbin}/python3.11"
fi
""", 0o755)  # fmt: skip
    monkeypatch.setenv("FAKE_HOME", str(slice_ / "home"))
    r = _setup(tree)
    assert r.returncode == 0, r.stderr
    log = (slice_ / "py.log").read_text().splitlines()
    assert any("install" in line and "python3.11-venv" in line for line in log)
    home = slice_ / "home" / "jaxrl-llm"
    assert f"{wbin}/python3.11 -m venv" in "\n".join(log)
    after = log[next(i for i, line in enumerate(log) if " -m venv" in line) + 1 :]
    assert after and all(line.startswith(".venv/bin/python ") for line in after), after
    assert any("-m pip install -e .[tpu]" in line for line in after)
    assert (home / "tpu_scripts" / "setup.sh").is_file()


def test_supported_pythons_match_requires_python():
    """install_worker.sh's list of Pythons is pyproject.toml's requires-python."""
    spec = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert spec == ">=3.11,<3.14"
    text = (REPO / "tpu_scripts" / "install_worker.sh").read_text()
    assert 'SUPPORTED="3.11 3.12 3.13"' in text
