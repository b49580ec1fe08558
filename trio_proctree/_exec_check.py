"""What the kernel's execve would refuse to run, read off the file before anything starts.

`subprocess.Popen` raises the kernel's error when the exec fails. Under cgroup
containment where the C library cannot start a process in a cgroup, the command is run
by /bin/sh's exec instead (the leader joins its cgroup first), and sh deals with these
failures its own way: it runs a file the kernel refuses as a shell script (POSIX asks
it to), and exits with status 127 and a message naming the wrapper where the kernel
found no interpreter. Read here, they are raised as Popen would raise them.
"""

from __future__ import annotations

import errno
import functools
import os
import struct
from typing import Any

#: Where Linux lists the binfmt_misc handlers, when that file system is mounted.
BINFMT_MISC = "/proc/sys/fs/binfmt_misc"

_ELF_MAGIC = b"\x7fELF"
_PT_INTERP = 3
#: The longest path Linux takes (PATH_MAX), which bounds a program interpreter's name.
_PATH_MAX = 4096


def refusal(path: str, name: str, cwd: Any) -> OSError | None:
    """What the exec of ``path`` (the program ``name``, run in ``cwd``) would fail with,
    where the file itself says it; None where it says nothing against running.

    FileNotFoundError for a ``#!`` script or a dynamically linked ELF program whose
    interpreter is missing; OSError (ENOEXEC) for a file of no format Linux runs. A file
    we may not read is left to the exec.
    """
    try:
        with open(path, "rb") as program:
            head = program.read(256)  # (the kernel reads no more of a #! line either)
            loader = _elf_interpreter(program.fileno(), head)
    except OSError:
        return None  # not ours to read: the exec will say what it says
    if head.startswith(_ELF_MAGIC):
        if loader is None:
            return None
        return _missing(loader, "the ELF program interpreter", name, cwd)
    if head.startswith(b"#!"):
        return _script_refusal(head, name, cwd)
    # The formats Linux runs itself are ELF and #! scripts (a.out went in 6.1); anything
    # else runs only through a binfmt_misc handler, which may match on any bytes or on
    # the file's name: where one is registered, the exec decides.
    if binfmt_misc_handlers():
        return None
    return OSError(errno.ENOEXEC, os.strerror(errno.ENOEXEC), name)  # (as Popen says it)


def _script_refusal(head: bytes, name: str, cwd: Any) -> OSError | None:
    """`refusal` for a file that starts with ``#!`` (``head``: its first 256 bytes)."""
    if b"\n" not in head:
        return None  # (a #! line the kernel cuts short is its to refuse, with ENOEXEC)
    # Read as the kernel reads it: up to the newline (or a NUL), the name after spaces
    # and tabs, up to the next; a \r is part of it (a script saved with CRLF line ends
    # names "/bin/sh\r", which the kernel does not find either).
    line = head[2 : head.index(b"\n")].split(b"\0", 1)[0].lstrip(b" \t")
    name_end = min((i for i in (line.find(b" "), line.find(b"\t")) if i >= 0), default=len(line))
    if not line[:name_end]:
        return None
    return _missing(os.fsdecode(line[:name_end]), "the #! line", name, cwd)


def _missing(interpreter: str, named_by: str, name: str, cwd: Any) -> OSError | None:
    """FileNotFoundError if ``interpreter`` (``named_by`` the program ``name``) is not
    there, as the kernel looks for it."""
    if cwd is not None and not os.path.isabs(interpreter):
        interpreter = os.path.join(os.fsdecode(cwd), interpreter)  # (as the kernel opens it)
    # (A binfmt_misc handler may take the file before the kernel's own formats do, and
    # run it its own way: where one is registered, the exec decides.)
    if os.path.exists(interpreter) or binfmt_misc_handlers():
        return None
    return FileNotFoundError(
        errno.ENOENT, f"no such interpreter {interpreter!r} ({named_by} of {name})", name
    )


def _elf_interpreter(fd: int, head: bytes) -> str | None:
    """The program interpreter (dynamic loader) that an ELF program of this machine names,
    if it names one the kernel would look for; None for a static program, one for
    another machine (the kernel refuses it, or a binfmt_misc handler runs it with a
    loader of its own), or one that does not read as ELF (the kernel's to refuse)."""
    layout = _elf_layout(head)
    if layout is None or layout != _own_elf_layout():
        return None
    byte_order, is_64 = layout[0], layout[1]
    if is_64:
        (phoff,) = struct.unpack_from(byte_order + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(byte_order + "HH", head, 54)
        entry_format, least = byte_order + "IIQQQQ", 56  # type, flags, offset, -, -, size
    else:
        (phoff,) = struct.unpack_from(byte_order + "I", head, 28)
        phentsize, phnum = struct.unpack_from(byte_order + "HH", head, 42)
        entry_format, least = byte_order + "IIIII", 20  # type, offset, -, -, size
    if phentsize < least or phentsize * phnum > 65536:  # (the kernel's own bound)
        return None
    table = os.pread(fd, phentsize * phnum, phoff)
    for start in range(0, len(table) - least + 1, phentsize):
        fields = struct.unpack_from(entry_format, table, start)
        if fields[0] != _PT_INTERP:
            continue
        offset, size = (fields[2], fields[5]) if is_64 else (fields[1], fields[4])
        if not 2 <= size <= _PATH_MAX:
            return None
        named = os.pread(fd, size, offset)
        if len(named) != size or not named.endswith(b"\0"):
            return None  # (not NUL-ended: the kernel refuses it, with ENOEXEC)
        return os.fsdecode(named.split(b"\0", 1)[0]) or None
    return None


def _elf_layout(head: bytes) -> tuple[str, bool, int] | None:
    """(byte order, 64-bit?, machine) of an ELF header; None if it does not read as one."""
    if len(head) < 64 or not head.startswith(_ELF_MAGIC):
        return None
    elf_class, data = head[4], head[5]
    if elf_class not in (1, 2) or data not in (1, 2):
        return None
    byte_order = "<" if data == 1 else ">"
    (machine,) = struct.unpack_from(byte_order + "H", head, 18)
    return byte_order, elf_class == 2, machine


@functools.cache
def _own_elf_layout() -> tuple[str, bool, int] | None:
    """The layout of this interpreter's own program: that of the machine's programs."""
    try:
        with open("/proc/self/exe", "rb") as own:
            return _elf_layout(own.read(64))
    except OSError:
        return None


def binfmt_misc_handlers() -> list[str]:
    """The names of the binfmt_misc handlers that can run programs now: none when the file
    system is not mounted, or it is but switched off (its ``status`` file)."""
    try:
        names = os.listdir(BINFMT_MISC)
        with open(os.path.join(BINFMT_MISC, "status")) as status:
            if status.read().strip() != "enabled":
                return []
    except OSError:
        return []
    handlers: list[str] = []
    for name in names:
        if name in ("register", "status"):
            continue
        try:
            with open(os.path.join(BINFMT_MISC, name)) as entry:
                if entry.readline().strip() == "enabled":
                    handlers.append(name)
        except OSError:
            continue  # (removed meanwhile)
    return handlers
