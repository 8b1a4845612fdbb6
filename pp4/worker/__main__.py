"""``python -m pp4.worker``, the name the worker had inside pp4: it runs ``python -m pp4_worker``.

The worker is a package of its own (pp4_worker/), which pp4 never imports. This forwarder stays
because the old command is documented and scripted (bench/worker/variants_ab.sh runs the worker of other
commits' trees by the one name they all answer to); it runs the worker by module name, so pp4
holds no import of it (tests/test_layers.py names this file as the one exception)."""
import runpy

if __name__ == "__main__":
    runpy.run_module("pp4_worker", run_name="__main__", alter_sys=True)
