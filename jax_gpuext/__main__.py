"""Command line: ``python -m jax_gpuext {info,gates,demo}``."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jax_gpuext")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, devices, libraries and every gate with its reason")
    info.add_argument("--json", action="store_true", help="print the report as JSON")
    g = sub.add_parser("gates", help="the gates table")
    g.add_argument("--markdown", action="store_true", help="the static table for docs/gates.md")
    g.add_argument("--backends", action="store_true",
                   help="the 'which backend will I get' tables for docs/gates.md (every op, auto's order)")
    g.add_argument("--verified", action="store_true",
                   help="the 'what is verified' table for docs/gates.md (from the verification record)")
    sub.add_parser("demo", help="print info, then run every op on the available devices")
    args = parser.parse_args(argv)

    if args.command == "info":
        from jax_gpuext.common.capabilities import capabilities, format_table

        report = capabilities()
        print(json.dumps(report, indent=2) if args.json else format_table(report))
    elif args.command == "gates":
        from jax_gpuext.common.capabilities import backends_markdown, capabilities, gates_markdown

        if args.verified:
            from jax_gpuext.common import verified

            print(verified.markdown())
        elif args.backends:
            print(backends_markdown())
        elif args.markdown:
            print(gates_markdown())
        else:
            for name, r in capabilities()["gates"].items():
                print(f"{name}: {'yes' if r['supported'] else 'no'} - {r['reason']}")
    elif args.command == "demo":
        import os

        # On a CPU-only machine, give the multi-device steps (all_reduce under shard_map) 8 host
        # devices. XLA reads this when its CPU backend starts, which has not happened yet here;
        # it does not change how many GPUs are used.
        if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                       " --xla_force_host_platform_device_count=8").strip()
        from jax_gpuext.demo import run

        return run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
