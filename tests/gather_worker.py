"""Worker of the rank-agreement test: each rank all-gathers two ints with ``all_gather_int``
and prints what it received.

    msrun --worker_num 2 --local_worker_num 2 ... tests/gather_worker.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import src.env  # noqa: F401,E402  (first: the oneDNN default before MindSpore loads)

# isort: split

import mindspore as ms  # noqa: E402

from src.utils.device import all_gather_int, init_distributed  # noqa: E402


def main():
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rank, _ = init_distributed(True, 1)
    print(f"rank {rank} gathered {all_gather_int(rank * 10 + 3)} "
          f"{all_gather_int(-1 + rank * 500000)}", flush=True)


if __name__ == "__main__":
    main()
