"""Loads the Hypothesis profile named by HYPOTHESIS_PROFILE (ci / nightly / dev), and imports every kvarena
module up front so that the derandomized ``ci`` examples do not depend on which test files a worker runs.

Why: Hypothesis mixes *local constants* into what it generates — literals mined from every non-test module
outside site-packages that is in ``sys.modules`` when a value is drawn (hypothesis/internal/conjecture/
providers.py, ``_get_local_constants``). With kvarena installed editable its own modules are local, so the
same derandomized test drew different examples after ``import kvarena.simulator`` than without it (a
decisions-level divergence found at example 56 in one import order was not found in 100 in another).
Importing the whole package first makes the constant pool, and so every ci run, the same in every process.
"""

import importlib
import os
import pkgutil

# Read when @triton.jit decorates: importing gpu/ below must already see it (the gpu test modules set it too,
# at collection, which under xdist happens in every worker before any test runs).
os.environ["TRITON_INTERPRET"] = "1"

import kvarena
from kvarena.conformance.runner.profiles import register_profiles

# mapped folders (pyproject)
SUBPACKAGES = ("spec", "reference", "gpu", "conformance", "proofs", "simulator", "engines")


def _import_everything() -> list[str]:
    missing = []
    names = [m.name for m in pkgutil.iter_modules(kvarena.__path__, "kvarena.") if m.name != "kvarena.__main__"]
    for sub in SUBPACKAGES:
        try:
            pkg = importlib.import_module(f"kvarena.{sub}")
        except ImportError as e:
            missing.append(f"kvarena.{sub} ({e.name})")
            continue
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, f"kvarena.{sub}.")]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:  # an optional extra that is not installed: its constants stay out everywhere
            missing.append(f"{name} ({e.name})")
    return missing


MISSING = _import_everything()
PROFILE = register_profiles()


def pytest_report_header(config):
    return f"hypothesis profile: {PROFILE}" + (f"; not importable: {', '.join(MISSING)}" if MISSING else "")
