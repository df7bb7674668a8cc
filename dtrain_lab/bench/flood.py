"""A rank that prints ``LINES`` lines of 1 KiB and ends (the launcher's output path under load:
:func:`dtrain_lab.bench.rows.launch_output`). Imports nothing but ``sys``."""
import sys

if __name__ == "__main__":
    line = "x" * 1023 + "\n"
    write = sys.stdout.write
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20000):
        write(line)
    sys.stdout.flush()
