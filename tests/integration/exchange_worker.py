"""Two processes exchange host objects by tag (`hosts.exchange_objects`) from a second
thread while the main thread runs cross-host device collectives; the half of the multi-host
test that checks the exchange the overlapped producer uses.

    python tests/integration/exchange_worker.py --out OUT --coordinator HOST:PORT \\
        --process-id I

The caller sets `XLA_FLAGS=--xla_force_host_platform_device_count=2` and `JAX_PLATFORMS=cpu`.
Writes OUT.p<process>.json: per exchange, each process's (first value, length) as received;
the main thread's gathered values; the exchange keys left in the service after.
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

import numpy as np


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--coordinator", required=True)
    p.add_argument("--process-id", type=int, required=True)
    args = p.parse_args(argv)

    import jax
    from jax._src import distributed
    from jax.experimental import multihost_utils

    from jaxrl_llm.sharding import hosts, initialize_distributed

    initialize_distributed(args.coordinator, 2, args.process_id)
    me = jax.process_index()
    exchanges: list = [None] * 6

    def exchange() -> None:
        # 2.4 MB a payload: three parts each. Rounds 3-5 repeat 0-2's data under new tags.
        for t in range(6):
            mine = np.full(300_000 + me, 100 * t + me, np.float64)
            got = hosts.exchange_objects(mine, f"test/{t}")
            exchanges[t] = [[int(x[0]), len(x)] for x in got]

    thread = threading.Thread(target=exchange)
    thread.start()
    collectives = []
    for c in range(40):  # device collectives across both hosts, meanwhile
        got = multihost_utils.process_allgather(np.asarray([me, c], np.int32))
        collectives.append(np.asarray(got).tolist())
    thread.join()
    client = distributed.global_state.client
    assert client is not None
    multihost_utils.sync_global_devices("exchanged")  # both hosts done deleting
    left = client.key_value_dir_get("jaxrl_llm/exchange/")
    result = {"exchanges": exchanges, "collectives": collectives, "keys_left": left}
    Path(f"{args.out}.p{me}.json").write_text(json.dumps(result) + "\n")
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
