"""NCCL / PyTorch-distributed environment: a linter for settings and a doctor for the machine.

=================== =====================================================================================
``vars.toml``       the knowledge base: every variable NCCL, PyTorch distributed and Gloo read, with the
                    official page each entry comes from (loaded by ``vars``)
``envfile``         ``.env`` files read exactly as ``docker run --env-file`` reads them
``lint``            :func:`lint_env` (a mapping such as ``os.environ``) and :func:`lint_env_file`;
                    value checks in ``values``, combinations in ``conflicts``, :class:`Finding` in
                    ``findings``
``machine``         :func:`doctor` inspects the machine (GPUs, interfaces, /dev/shm, ulimits, versions);
                    ``recommend`` turns the report into advice; :func:`format_doctor` prints it
``select``          which interfaces an ``NCCL_SOCKET_IFNAME`` / ``NCCL_IB_HCA`` list selects
``cli``             ``dtrain-lab nccl lint|doctor`` (:func:`main_lint`, :func:`main_doctor`)
=================== =====================================================================================

Every message is bilingual and comes from the catalogue (``nccl/messages.toml``).
"""
from dtrain_lab.nccl.cli import main_doctor, main_lint
from dtrain_lab.nccl.machine import doctor, format_doctor
from dtrain_lab.nccl.envfile import EnvFile, EnvFileError, parse_env_file, read_env_file
from dtrain_lab.nccl.findings import SEVERITIES, Finding
from dtrain_lab.nccl.lint import lint_env, lint_env_file, relevant
from dtrain_lab.nccl.select import nccl_list_selects, socket_ifname_selects
from dtrain_lab.nccl.vars import VARS

__all__ = ["Finding", "EnvFile", "EnvFileError", "lint_env", "lint_env_file", "parse_env_file", "read_env_file",
           "relevant", "doctor", "format_doctor", "main_lint", "main_doctor", "nccl_list_selects",
           "socket_ifname_selects", "VARS", "SEVERITIES"]
