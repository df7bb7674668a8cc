"""A classmate's worst neighbour (issue 22, point 4), graded as lab10.rank_branch: rank 0 starts 300
busy loops, each in a session of its own (one scheduling autogroup each, where the kernel has them);
rank 1 forks until the kernel refuses (a fork bomb: each child busy-loops too) and a thread holds all
the memory it can get. Then both wait for the grader's clock. Its own grade does not matter: what is
checked is that a correct classmate graded beside it (-j 2) keeps its verdict, and, in make bench,
how much slower that classmate gets."""
import os
import threading
import time


def _spin():
    try:
        os.setsid()
    except OSError:
        pass
    while True:
        pass


def _burn(n):
    for _ in range(n):
        try:
            if os.fork() == 0:
                _spin()
        except OSError:
            return


def _hog(held):
    chunk = 64 << 20
    try:
        while True:
            block = bytearray(chunk)
            for i in range(0, chunk, 4096):   # touch every page: resident, not only reserved
                block[i] = 1
            held.append(block)
    except MemoryError:
        pass


def run():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        _burn(300)
    else:
        held = []
        threading.Thread(target=_hog, args=(held,), daemon=True).start()
        _burn(100000)
    time.sleep(600)
    return 0.0
