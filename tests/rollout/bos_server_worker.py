"""Run by `test_server.py::test_validation_counts_the_bos_the_server_prepends` in its own
process: `jaxrl-llm serve` on the shipped checkpoint with its tokenizer given a BOS token
(id 1, as Llama's tokenizer has one; the shipped one has none), max prefill length 40.
Prints "READY host:port", serves until SIGINT, then prints "STOPPED"."""

import signal
import threading

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import CausalLM, from_pretrained, load_tokenizer
from jaxrl_llm.rollout import Engine
from jaxrl_llm.rollout.server import start_server


def main() -> None:
    path = builtin_checkpoint()
    model = from_pretrained(path)
    assert isinstance(model, CausalLM)
    tokenizer = load_tokenizer(path)
    tokenizer.bos_token = tokenizer.convert_ids_to_tokens(1)
    engine = Engine(
        model,
        max_concurrent_decodes=2,
        max_cache_length=64,
        max_prefill_length=40,
        tokenizer=tokenizer,
        checkpoint_path=str(path),
    )
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = start_server(engine)
    print(f"READY 127.0.0.1:{server.port}", flush=True)
    stop.wait()
    server.stop()
    print("STOPPED", flush=True)


if __name__ == "__main__":
    main()
