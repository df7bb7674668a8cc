"""A classmate's worst neighbour (issue 22, point 4), graded as lab10.rank_branch: rank 0 starts 300
busy loops, each in a session of its own (one scheduling autogroup each, where the kernel has them);
rank 1 forks until the kernel refuses (a fork bomb: each child busy-loops too) and a thread holds all
the memory it can get. Then both keep it up for HOLD_S seconds (longer than a correct classmate's grade
takes here, so that the whole of it runs beside them) and return a wrong answer, if the grader's
clock has not stopped them first (with its own processes spinning, the forking rank is slow). Its own grade does not
matter: what is checked is that a correct classmate graded beside it (-j 2) keeps its verdict, and, in
make bench, how much slower that classmate gets."""
import os
import threading
import time

HOLD_S = 5.0


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
        _burn(100000)                 # first: forking a process that holds gigabytes is slow
        held = []
        threading.Thread(target=_hog, args=(held,), daemon=True).start()
    time.sleep(HOLD_S)
    return 0.0
