"""A stand-in for a notebook kernel: launches a job that sleeps, to be interrupted or killed."""
import faulthandler
import signal
import sys

import dtrain_lab

faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for our stack if we are stuck
# A kernel turns SIGINT into KeyboardInterrupt. Python does so only if SIGINT was not ignored when it
# started, and a test run started in the background (`cmd &` in a script) inherits SIGINT ignored:
# install the handler explicitly, as a Jupyter kernel does.
signal.signal(signal.SIGINT, signal.default_int_handler)

tag = sys.argv[1]
try:
    # torchrun's grace between SIGTERM and SIGKILL for workers that ignore SIGTERM: 5 s, not 30
    dtrain_lab.launch(sys.argv[2], nproc=2, args=["sleep_ignore_term"], timeout=300, env={"DTRAIN_TEST_TAG": tag},
                      torchrun_args=["--shutdown-timeout", "5"])
except KeyboardInterrupt:
    print("DRIVER-INTERRUPTED", flush=True)
    sys.exit(130)
