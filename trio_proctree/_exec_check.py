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
import stat
import struct
from typing import Any

#: Where Linux lists the binfmt_misc handlers, when that file system is mounted.
BINFMT_MISC = "/proc/sys/fs/binfmt_misc"

_ELF_MAGIC = b"\x7fELF"
_PT_INTERP = 3
#: The longest path Linux takes (PATH_MAX), which bounds a program interpreter's name.
_PATH_MAX = 4096


MISSING, NOT_EXECUTABLE, EXECUTABLE = "missing", "not executable", "executable"

#: How deep Linux follows a program's interpreters (a #! script whose interpreter is
#: itself a #! script, ...): the program at depth 0, its interpreters down to this depth;
#: one beyond it, and the exec fails with ELOOP.
_MAX_DEPTH = 5


def exec_path(env: Any) -> list[Any]:
    """The PATH entries Popen's child searches (`os.get_exec_path`), ``env``'s or ours
    (None). Ours read directly: `os.get_exec_path` enters a warnings filter at every call
    (~3 us against ~0.6 us, two or three times a spawn), needed only for an environment
    whose keys may be bytes."""
    if env is None:
        return os.environ.get("PATH", os.defpath).split(os.pathsep)
    return os.get_exec_path(env)


def look_at(path: str) -> str | OSError:
    """Whether ``path`` is missing, there but no executable file, or an executable file;
    or the error the exec would meet on the way to it (EACCES: a directory we may not
    search), which Popen's search reports, where a missing file it passes over.

    One stat for a PATH entry that does not have it (most of them, on every spawn).
    """
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return MISSING
    except OSError as exc:
        return type(exc)(exc.errno, exc.strerror, path)
    if stat.S_ISREG(mode) and os.access(path, os.X_OK):
        return EXECUTABLE
    return NOT_EXECUTABLE


def refusal(path: str, name: str, cwd: Any, *, _depth: int = 0) -> OSError | None:
    """What the exec of ``path`` (the program ``name``, run in ``cwd``) would fail with,
    where the file itself says it; None where it says nothing against running.

    FileNotFoundError for a ``#!`` script or a dynamically linked ELF program whose
    interpreter is missing, PermissionError for one that is not executable; OSError
    (ENOEXEC) for a file of no format Linux runs, or a ``#!`` line it cannot read; the
    same for an interpreter, as deep as Linux follows them. A file we may not read is
    left to the exec.
    """
    try:
        # (No buffered file object: its layers cost more than the reads, on every spawn.)
        program = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            head = os.read(program, 256)  # (the kernel reads no more of a #! line)
            loader = _elf_interpreter(program, head)
        finally:
            os.close(program)
    except OSError:
        return None  # not ours to read: the exec will say what it says
    if head.startswith(_ELF_MAGIC):
        interpreter, named_by = loader, "the ELF program interpreter"
    elif head.startswith(b"#!"):
        interpreter, named_by = hash_bang_interpreter(head), "the #! line"
        if interpreter is None:
            message = f"{os.strerror(errno.ENOEXEC)}: a #! line Linux cannot read"
            return _unless_handled(OSError(errno.ENOEXEC, message, name))
    else:
        # The formats Linux runs itself are ELF and #! scripts (a.out went in 6.1);
        # anything else runs only through a binfmt_misc handler.
        return _unless_handled(OSError(errno.ENOEXEC, os.strerror(errno.ENOEXEC), name))
    if interpreter is None:
        return None  # (a statically linked program)
    return _interpreter_refusal(
        interpreter, named_by=named_by, path=path, name=name, cwd=cwd, depth=_depth
    )


def _unless_handled(error: OSError) -> OSError | None:
    """``error``, unless a binfmt_misc handler is registered: one may take a file before
    the kernel's own formats do, by any bytes or by its name, and run it its own way;
    then the exec decides. (Asked only on the way to an error: it reads a directory.)"""
    return None if binfmt_misc_handlers() else error


def hash_bang_interpreter(head: bytes) -> str | None:
    """The interpreter that a ``#!`` line names (``head``: the file's first 256 bytes),
    read as Linux reads it (fs/binfmt_script.c); None where Linux refuses the line with
    ENOEXEC: no name on it, or a name cut short by the 256 bytes it reads.

    The line ends at a newline (or, where a NUL comes first, at the buffer's end); the
    name comes after spaces and tabs, up to the next space, tab or NUL. A ``\r`` is part
    of it (a script saved with CRLF line ends names "/bin/sh\r", which is not found).
    """
    buf = head[:256].ljust(256, b"\0")  # (the kernel's buffer: zeros past the file's end)
    nul = buf.find(b"\0")
    end = buf.find(b"\n", 0, 256 if nul < 0 else nul)  # (its search stops at a NUL)
    if end < 0:
        first = _first_not_blank(buf, 2, 255)
        if first is None or _first_terminator(buf, first, 255) is None:
            return None  # all blanks, or a name that runs on past what was read
        end = 255
    while buf[end - 1] in b" \t":
        end -= 1
    first = _first_not_blank(buf, 2, end)
    if first is None or first == end:
        return None
    stop = _first_terminator(buf, first, end)
    return os.fsdecode(buf[first : end if stop is None else stop])


def _first_not_blank(buf: bytes, first: int, last: int) -> int | None:
    return next((i for i in range(first, last + 1) if buf[i] not in b" \t"), None)


def _first_terminator(buf: bytes, first: int, last: int) -> int | None:
    return next((i for i in range(first, last + 1) if buf[i] in b" \t\0"), None)


def _interpreter_refusal(
    interpreter: str, *, named_by: str, path: str, name: str, cwd: Any, depth: int
) -> OSError | None:
    """What the kernel's start of ``interpreter`` (``named_by`` the file ``path``, the
    program ``name`` or an interpreter of it) would fail with, as Popen raises it for
    ``name``: missing, not executable, or refused in its turn."""
    if not interpreter:
        interpreter = "."  # (the kernel opens "" as the working directory: EACCES)
    if cwd is not None and not os.path.isabs(interpreter):
        interpreter = os.path.join(os.fsdecode(cwd), interpreter)  # (as the kernel opens it)
    whose = name if depth == 0 else f"{path}, an interpreter of {name}"
    found = look_at(interpreter)
    error: OSError
    if found == MISSING:
        message = f"no such interpreter {interpreter!r} ({named_by} of {whose})"
        error = FileNotFoundError(errno.ENOENT, message, name)
    elif isinstance(found, OSError):  # (a directory on the way we may not search, say)
        message = f"interpreter {interpreter!r} ({named_by} of {whose}): {found.strerror}"
        error = type(found)(found.errno, message, name)
    elif found == NOT_EXECUTABLE:
        message = f"interpreter {interpreter!r} ({named_by} of {whose}) is not executable"
        error = PermissionError(errno.EACCES, message, name)
    elif named_by != "the #! line":
        return None  # (a dynamic loader: what it is made of is the kernel's to check)
    elif depth + 1 > _MAX_DEPTH:
        error = OSError(errno.ELOOP, f"{os.strerror(errno.ELOOP)}: #! interpreters", name)
    else:
        return refusal(interpreter, name, cwd, _depth=depth + 1)
    return _unless_handled(error)


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
