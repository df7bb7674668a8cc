"""Misbehaving programs for the launcher's tests: python hostile.py MODE."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
rank = int(os.environ["RANK"])

if mode == "never_init":          # rank 1 never joins the process group: start-up hangs
    if rank == 1:
        time.sleep(3600)
    dist.init_process_group("gloo")

dist.init_process_group("gloo")

if mode == "recv_recv":           # a program that never imports dtrain_lab: both ranks wait to receive
    buf = torch.zeros(4)
    dist.recv(buf, src=1 - rank)
elif mode == "fork_daemon":       # leaves a double-forked, setsid daemon behind, then exits 0
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(3600)
        os._exit(0)
    time.sleep(0.5)
elif mode == "flood":             # megabytes of output
    line = "x" * 1000
    for i in range(6000):
        print(i, line)
elif mode == "ends_with_a_thread":  # the program returns while a non-daemon thread still works
    import atexit
    import threading

    dist.barrier()   # both ranks through init first (the reason is at the end of this file)
    dist.destroy_process_group()
    atexit.register(lambda: print("atexit ran", flush=True))
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread finished", flush=True))).start()
    sys.exit(0)
elif mode == "os_exit":           # rank 1 disappears without a traceback
    if rank == 1:
        os._exit(3)
    time.sleep(3600)              # rank 0 can only end by being stopped: rank 1 is the first failure
elif mode == "sleep_ignore_term":  # ignores SIGTERM and sleeps: must still be killed
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)
elif mode == "args":
    print("args:", sys.argv[2:])
    leaked = sorted(k for k in globals() if k.startswith("_") and not k.startswith("__"))  # none of ours
    print("main:", __name__, os.path.basename(sys.argv[0]), leaked, os.path.basename(sys.path[0]))
# both ranks through init before either leaves: under load a rank that returned from
# init_process_group and exited at once closed the socket of a peer still in gloo's connectFullMesh
dist.barrier()
dist.destroy_process_group()
os._exit(0)
