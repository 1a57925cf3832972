"""The code a pipeline's Spark job runs, as one archive for `--py-files` (spark-submit) or
`addArtifacts` (Spark Connect): the library with its SQL files (not its jar: Spark's
classpath has it, `python -m exactly_once jar`), and the top-level package of the pipeline's
transform. So a driver and executors on other machines import exactly what the task that
started the attempt runs, never what their own `sys.path` holds.

The archive is built once per content, named by its hash, in a folder of the temporary
directory only the task's user may write (a shared host's other users cannot plant code
in it): tasks of one deployment share it, and a deploy makes a new one.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import zipfile
from pathlib import Path

from exactly_once.config import PipelineConfig
from exactly_once.packages import LIBRARY, package_files, transform_package

FIXED_TIME = (2026, 1, 1, 0, 0, 0)  # the same content makes the same archive
# spark-submit's application must be a file: this one runs the job's module from the code
# archive (--py-files), so nothing is run from a path into an installation or a checkout.
LAUNCHER = "import sys\nfrom exactly_once.spark.job import main\nsys.exit(main())\n"


def code_archive(config: PipelineConfig) -> Path:
    """The archive of the library and the transform's package (a zip of .py and .sql files)."""
    entries = {name: path for name, path in package_files(LIBRARY, "exactly_once") if path.suffix != ".jar"}
    if config.transform:
        entries.update(package_files(*transform_package(config)))
    content = io.BytesIO()
    with zipfile.ZipFile(content, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(entries):
            archive.writestr(zipfile.ZipInfo(name, FIXED_TIME), entries[name].read_bytes())
    return _written(content.getvalue(), "code", ".zip")


def launcher() -> Path:
    """spark-submit's application file (LAUNCHER)."""
    return _written(LAUNCHER.encode(), "launch-increment", ".py")


def _written(data: bytes, prefix: str, suffix: str) -> Path:
    """`data` in the private folder, in a file named by its hash."""
    folder = _private_folder()
    path = folder / f"{prefix}-{hashlib.sha256(data).hexdigest()[:16]}{suffix}"
    if not path.exists():
        descriptor, partial = tempfile.mkstemp(dir=folder, suffix=".part")  # a name no other writer has
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        os.replace(partial, path)  # atomic: a concurrent task sees the whole file or none
    return path


def _private_folder() -> Path:
    folder = Path(tempfile.gettempdir()) / f"exactly_once-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    found = folder.lstat()
    if found.st_uid != os.getuid() or found.st_mode & 0o077 or not folder.is_dir() or folder.is_symlink():
        raise PermissionError(f"{folder} must be a folder of user {os.getuid()} that no one else may use")
    return folder
