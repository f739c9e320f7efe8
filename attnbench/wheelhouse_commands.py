"""``attnbench wheelhouse``: download the optional backends' wheels for a GPU host without network."""
from __future__ import annotations

import subprocess
import sys

from attnbench.arguments import bounded_int


def _cmd_wheelhouse(args) -> int:
    from attnbench.wheelhouse import Target, WheelhouseError, build_wheelhouse, read_have

    try:
        target = Target(python=args.python, glibc=args.glibc, machine=args.machine, cuda=args.cuda)
        pins = build_wheelhouse(args.sets or [], args.out, target=target, extra=args.require or [],
                                have=read_have(args.have), no_pip_config=args.no_pip_config)
    except (WheelhouseError, OSError) as err:
        print(f"attnbench: error: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        print(f"attnbench: error: pip exited with {err.returncode} ({' '.join(err.cmd[3:5])}); see its output above",
              file=sys.stderr)
        return 2
    print(f"{len(pins)} wheels in {args.out}; on the GPU host: "
          f"pip install --no-index --find-links {args.out} --no-deps -r {args.out}/requirements.txt", file=sys.stderr)
    return 0


def add_commands(subparsers) -> None:
    from attnbench.wheelhouse import SETS

    p = subparsers.add_parser("wheelhouse", help="download optional backends' wheels for an offline GPU host")
    p.add_argument("--sets", nargs="+", choices=sorted(SETS), help="backend sets to download")
    p.add_argument("--require", action="append", metavar="REQ", help="another requirement, e.g. flashinfer-python==0.7.4")
    p.add_argument("--out", required=True, help="folder for the wheels and requirements.txt")
    p.add_argument("--python", default="3.12", help="the host's Python MAJOR.MINOR (default 3.12)")
    p.add_argument("--glibc", default="2.28", help="the host's glibc MAJOR.MINOR: newest manylinux tag accepted (default 2.28)")
    p.add_argument("--machine", default="x86_64", choices=["x86_64", "aarch64"])
    p.add_argument("--cuda", type=bounded_int(11, 99), default=13,
                   help="the host's CUDA major version: picks -cuNN wheel flavours (default 13)")
    p.add_argument("--have", help="file of package names the host already has (one a line); they are not downloaded")
    p.add_argument("--no-pip-config", action="store_true",
                   help="ignore pip config files (their constraints or indexes can break resolution for another platform)")
    p.set_defaults(func=_cmd_wheelhouse)
