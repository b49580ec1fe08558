"""Named mutants of the containment and close-path code, each against the tests that
exist for it: every one must turn them red.

These are the bugs the field notes and the issues name (a cleanup restarted by each
cancellation, asyncio.shield, a lazily started close, no SIGCONT, an early reap, ...).
mutmut covers the pure policy and state machine (see pyproject.toml); this covers the
code whose tests need real processes, where mutmut's forked workers would take hours.

Each mutant is applied to a copy of the package (with the tests and pyproject.toml) in a
temporary directory, where pytest then runs; the checkout is never modified.

    python tests/mutation/named_mutants.py [NAME-PREFIX ...]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Debian 13's C library, as ``nox -s tests_glibc`` fetched it: mutants of the direct start
#: into a cgroup (glibc 2.41+) run their tests under it.
GLIBC = ROOT / ".nox" / "_glibc" / "root"

# name, file, original text, mutated text, tests that must go red (pytest -k)
MUTANTS = [
    (
        "close: waiting on the cleanup directly, not via its own task",
        "asyncio.py",
        "        return self._await_cleanup(self._start_cleanup())",
        "        return self._core.cleanup(_AsyncioIO(self))",
        "test_one_cleanup_round_under_a_cancel_storm or task_group_aborting",
    ),
    (
        "close: no anyio shield around the wait loop",
        "asyncio.py",
        "    anyio = _anyio_in_use()\n    if anyio is None:\n        return contextlib.nullcontext()",
        "    anyio = _anyio_in_use()\n    if True:\n        return contextlib.nullcontext()",
        "test_no_hot_spin",
    ),
    (
        "close: cleanup error re-raised before the cancellation",
        "asyncio.py",
        "    error = None if future.cancelled() else future.exception()\n    if cancelled is not None:",
        "    error = None if future.cancelled() else future.exception()\n    if error is not None:\n        raise error\n    if cancelled is not None:",
        "test_cancellation_wins_over_a_cleanup_error or test_a_timeout_still",
    ),
    (
        "close: final cleanup_task.result() dropped",
        "asyncio.py",
        "    return future.result()\n",
        "    return None\n",
        "test_without_cancellation_the_caller_gets",
    ),
    (
        "close: asyncio.shield instead of asyncio.wait",
        "asyncio.py",
        "                await asyncio.wait({future})",
        "                await asyncio.shield(future)",
        "test_close_path_reports_nothing",
    ),
    (
        "close: aclose a coroutine function starting the cleanup lazily",
        "asyncio.py",
        "    def aclose(self) -> Coroutine[Any, Any, None]:",
        "    async def aclose(self) -> None:  # type: ignore\n"
        "        return await self._await_cleanup(self._start_cleanup())\n\n"
        "    def _unused(self) -> Coroutine[Any, Any, None]:",
        "test_cancel_before_the_first_step",
    ),
    (
        "close: no atexit hook",
        "_core.py",
        "atexit.register(_at_exit)",
        "pass",
        "test_trees_open_at_interpreter_exit",
    ),
    (
        "cgroup: out of file descriptors while pinning a lost leader's listing, it fails",
        "_containment.py",
        "        except OSError:\n            self._unpin()\n",
        "        except OSError:\n            self._unpin()\n            raise\n",
        "test_a_reaped_leaders_group_is_asked_about_once and runs-out",
    ),
    (
        "cgroup: homes of other pid namespaces never swept, even once they ended",
        "_cgroup.py",
        "    found: set[int] = {INITIAL_PID_NAMESPACE}\n",
        "    return _AllNamespaces()\n    found: set[int] = {INITIAL_PID_NAMESPACE}\n",
        "test_a_home_of_an_ended_pid_namespace_is_swept",
    ),
    (
        "cgroup: a /proc that hides processes trusted to show every live pid namespace",
        "_cgroup.py",
        "    if _pid_namespace() != INITIAL_PID_NAMESPACE or proc_hides_processes():\n",
        "    if _pid_namespace() != INITIAL_PID_NAMESPACE:\n",
        "test_under_a_proc_that_hides_processes",
    ),
    (
        "cgroup: what was put in an ended pid namespace's home is killed by the sweep",
        "_cgroup.py",
        "                    if home_namespace != namespace:\n"
        "                        continue  # (left, with the home: not its owner's)\n",
        "",
        "test_a_home_of_an_ended_pid_namespace_is_swept",
    ),
    (
        "spawn: a leader whose pidfd cannot open taken for one that started nothing",
        "_spawn.py",
        "        raise StartedUnwatched(exc) from None\n    lost = pidfd is None\n",
        "        raise\n    lost = pidfd is None\n",
        "test_a_failed_spawn_whose_leader_had_started_a_member and pidfd",
    ),
    (
        "exec check: an ELF program's missing loader left to the exec",
        "_exec_check.py",
        '        interpreter, named_by = loader, "the ELF program interpreter"\n',
        "        interpreter, named_by = None, None\n",
        "elf_program_whose_interpreter_is_missing",
    ),
    (
        "exec check: a 32-bit program header read at 64-bit offsets",
        "_exec_check.py",
        "        offset, size = (fields[2], fields[5]) if is_64 else (fields[1], fields[4])\n",
        "        offset, size = (fields[2], fields[4])\n",
        "class_and_byte_order",
    ),
    (
        "spawn: the search stops at a file the kernel refuses, as Popen's does not",
        "_spawn.py",
        "            failed = failed or refused\n",
        "            raise refused\n",
        "passes_over_a_file_the_kernel_refuses",
    ),
    (
        "cgroup: sh's exec given the name, where Popen's search passed over a file",
        "_through_sh.py",
        '    if found is not None and (passed_over or b"PATH" not in names):\n',
        '    if found is not None and b"PATH" not in names:\n',
        "passes_over_a_file_the_kernel_refuses and cgroup",
    ),
    (
        "cgroup: with no PATH, sh's own default searched (not os.defpath, as Popen)",
        "_through_sh.py",
        '    if found is not None and (passed_over or b"PATH" not in names):\n',
        "    if found is not None and passed_over:\n",
        "without_path_the_search_is_popens_default and cgroup",
    ),
    (
        "cgroup: a remembered search trusted for what sh's search passes over",
        "_cgroup.py",
        "            if found.remembered and not nothing_came_before(found):\n",
        "            if False:\n",
        "appears_earlier_on_path and cgroup",
    ),
    (
        "cgroup: variables sh cannot pass on given to sh all the same",
        "_through_sh.py",
        "    if not _pass_through_sh(names):\n",
        "    if False:\n",
        "environment_reaches_the_command_unchanged and cgroup",
    ),
    (
        "cgroup: IFS, OPTIND and PPID left to the shell that resets them",
        "_through_sh.py",
        "        _SET_BY_THE_SHELL.isdisjoint(names)\n",
        "        True\n",
        "environment_reaches_the_command_unchanged and cgroup",
    ),
    (
        "exec check: a #! line the kernel cannot read taken for a name",
        "_exec_check.py",
        "    if first is None or first == end:\n        return None\n",
        "    if first is None:\n        return None\n",
        "hash_bang_line_the_kernel_refuses and cgroup",
    ),
    (
        "exec check: a #! name cut short by the 256 bytes read taken whole",
        "_exec_check.py",
        "        if first is None or _first_terminator(buf, first, 255) is None:\n",
        "        if first is None:\n",
        "hash_bang_line_the_kernel_refuses and cgroup",
    ),
    (
        "exec check: a #! interpreter only looked for, not at",
        "_exec_check.py",
        "    elif found == NOT_EXECUTABLE:\n",
        "    elif False:\n",
        "interpreter_the_kernel_cannot_start and cgroup",
    ),
    (
        "exec check: a #! interpreter's own format not checked",
        "_exec_check.py",
        "        return refusal(interpreter, name, cwd, _depth=depth + 1)\n",
        "        return None\n",
        "interpreter_the_kernel_cannot_start and cgroup",
    ),
    (
        "spawn: a directory we may not search taken for a missing file",
        "_exec_check.py",
        "    except OSError as exc:\n        return type(exc)(exc.errno, exc.strerror, path)\n",
        "    except OSError:\n        return MISSING\n",
        "may_not_search",
    ),
    (
        "watchdog: a lost one replaced, but told nothing of the trees open",
        "_watchdog.py",
        '                watchdog.send(["+" + entry for entry in _registered])\n',
        "                pass\n",
        "lost_watchdog",
    ),
    (
        "watchdog: written to with SIGPIPE possible",
        "_watchdog.py",
        "        self._socket.sendall(data, socket.MSG_NOSIGNAL)\n",
        "        self._socket.sendall(data)\n",
        "lost_watchdog and default",
    ),
    (
        "watchdog: a pass over /proc per marker",
        "_watchdog.py",
        "if markers:\n    kill_marked(set(markers), deadline=0)\n",
        "for marker in markers:\n    kill_marked({marker}, deadline=0)\n",
        "200_subreaper",
    ),
    (
        "fork: the watchdog's lock kept as the parent held it",
        "_watchdog.py",
        'renewed_in_forked_child(globals(), "_lock")\n',
        "",
        "forked_while and watchdog",
    ),
    (
        "fork: the cgroup home's lock kept as the parent held it",
        "_cgroup.py",
        'renewed_in_forked_child(globals(), "_home_lock")\n',
        "",
        "forked_while and cgroup",
    ),
    (
        "sweep: start times compared as each time namespace shows them",
        "_cgroup.py",
        "    return stat.starttime - (boottime_offset() or 0)\n",
        "    return stat.starttime\n",
        "time_namespace and 1000",
    ),
    (
        "sweep: an owner's start time rounded a tick apart taken for another's",
        "_cgroup.py",
        "    return offset is None or abs(stat.starttime - offset - named) <= 1\n",
        "    return offset is None or abs(stat.starttime - offset - named) <= 0\n",
        "time_namespace and half",
    ),
    (
        "sweep: the offset of the children's time namespace taken for our own",
        "_procfs.py",
        "    if own == INITIAL_TIME_NAMESPACE:\n        return 0\n    if own != childrens:\n"
        "        return None\n",
        "",
        "time_namespace and entered",
    ),
    (
        "sweep: a member whose main thread exited left to cgroup.kill alone",
        "_cgroup.py",
        "                    _kill_main_thread_gone(tree)\n",
        "",
        "stale_member_whose",
    ),
    (
        "watchdog: a group registered only once the driver has the spawn's result",
        "_choose.py",
        "    containment.started(spawned)\n",
        "",
        "between_spawn_and_setup and group",
    ),
    (
        "exec check: a chain of five #! scripts refused as too deep",
        "_exec_check.py",
        "    elif depth + 1 > _MAX_DEPTH:\n",
        "    elif depth + 1 >= _MAX_DEPTH:\n",
        "chain_of_scripts",
    ),
    (
        "exec check: an empty #! name taken for a missing file (the kernel opens the cwd)",
        "_exec_check.py",
        '        interpreter = "."  # (the kernel opens "" as the working directory: EACCES)\n',
        "        pass\n",
        "empty-name",
    ),
    (
        "cgroup: the wrapper given the environment env(1) also carries in its arguments",
        "_cgroup.py",
        "            command_env=wrapper_env,\n",
        "            command_env=None,\n",
        "large_environment and cgroup",
    ),
    (
        "spawn: process_group=0 given a new session",
        "_spawn.py",
        "        new_session = False\n",
        "        pass\n",
        "process_group_0_keeps",
    ),
    (
        "escalation: a leader-only step sent to every process too",
        "_containment.py",
        "    signal_pidfd(leader.pidfd, sig)\n    return True\n",
        "    signal_pidfd(leader.pidfd, sig)\n    return False\n",
        "leader_only_step_lets_the_leader_stop",
    ),
    (
        "escalation: a leader-only step given to a leader that has exited",
        "_containment.py",
        "    if leader.poll() is not None or leader.reaped or leader.lost:\n        return False\n",
        "    if False:\n        return False\n",
        "leader_only_step_goes_to_the_whole_tree",
    ),
    (
        "asyncio: a reader's pipe closed with what it still holds unread",
        "asyncio.py",
        "                _drain_into(reader, transport)\n",
        "                pass\n",
        "holds_all_the_tree_said",
    ),
    (
        "asyncio: a reader taken off the tree left open by cleanup",
        "asyncio.py",
        "            if getattr(self, name) is reader:\n                setattr(self, name, None)\n",
        "            if getattr(self, name) is not reader:\n                continue\n"
        "            setattr(self, name, None)\n",
        "escapee_holds",
    ),
    (
        "escalation: a leader that exits within its step leaves its members the grace",
        "_core.py",
        "            if leader_step is not None and isinstance(pending, list) and self._failed(",
        "            if False and isinstance(pending, list) and self._failed(",
        "hands_the_step_on or hands_it_on",
    ),
    (
        "escalation: a leader that exited with a status of its own hands its step on",
        "_core.py",
        "        return returncode < 0 and not (step.caught",
        "        return not (step.caught",
        "had_its_chance",
    ),
    (
        "escalation: a leader reaped elsewhere within its step never hands it on",
        "_core.py",
        "            return self.leader.lost\n",
        "            return False\n",
        "reaped_elsewhere_within_its_step",
    ),
    (
        "escalation: a leader that re-raised the step it handled hands it on",
        "_core.py",
        " and not (step.caught and returncode == -step.signal)\n",
        "\n",
        "had_its_chance and reraises",
    ),
    (
        "escalation: whether the leader handles the step's signal is not asked",
        "_core.py",
        "                caught = catches(self.leader.pid, sig)",
        "                caught = False",
        "had_its_chance and reraises",
    ),
    (
        "escalation: a look at the leader's handlers that fails keeps its step from going",
        "_procfs.py",
        '        status = read_file(f"/proc/{pid}/status")\n    except OSError:\n',
        '        status = read_file(f"/proc/{pid}/status")\n'
        "    except (FileNotFoundError, ProcessLookupError):\n",
        "stop_the_tree_in_order and refused",
    ),
    (
        "escalation: a leader that crashed within its step never hands it on",
        "_core.py",
        "        return returncode < 0 and not (step.caught and returncode == -step.signal)\n",
        "        return returncode == -step.signal and not step.caught\n",
        "fails_its_step and crash",
    ),
    (
        "escalation: a step handed on to a tree the program killed during it",
        "_core.py",
        "        if self._killed:\n            return False  # the program's kill() meanwhile",
        "        if False:\n            return False  # the program's kill() meanwhile",
        "killed_the_tree_itself",
    ),
    (
        "asyncio: a reader the program ended itself fed at cleanup's end",
        "asyncio.py",
        '    if getattr(reader, "_eof", False):',
        "    if False:",
        "ended_itself",
    ),
    (
        "escalation: a leader lost after its status was seen hands its step on",
        "_core.py",
        "        if returncode is None:\n            return self.leader.lost\n",
        "        if returncode is None or self.leader.lost:\n            return self.leader.lost\n",
        "status_was_seen",
    ),
    (
        "escalation: a step handed on goes to the leader alone again",
        "_teardown.py",
        "                yield SendSignal(step.signal)\n",
        "                yield SendSignal(step.signal, leader_only=True)\n",
        "hands_its_step_on",
    ),
    (
        "escalation: a step handed on gets its whole wait again (the bound broken)",
        "_teardown.py",
        "                emptied = yield AwaitEmpty(emptied.remaining)\n",
        "                emptied = yield AwaitEmpty(step.wait)\n",
        "hands_its_step_on",
    ),
    (
        "escalation: no SIGCONT to the tree after a leader-only step (group)",
        "_containment.py",
        "                self._signal(signal.SIGCONT)  # (see signal_leader_alone)\n",
        "                pass\n",
        "stopped_tree_is_woken and group",
    ),
    (
        "escalation: no SIGCONT to the tree after a leader-only step (cgroup, subreaper)",
        "_containment.py",
        "        self._signal_group(signal.SIGCONT, pins=self.leader.pins_group)\n",
        "        pass\n",
        "stopped_tree_is_woken and (cgroup or subreaper)",
    ),
    (
        "cgroup: escapees not listed before the hard stop when no step listed them",
        "_cgroup.py",
        "        if self._survey_due or not self._surveyed:\n            # The",
        "        if self._survey_due:\n            # The",
        "escapees_are_counted_after_steps_for_the_leader_alone",
    ),
    (
        "exec check: a file of no format Linux runs left to /bin/sh's exec",
        "_exec_check.py",
        "        return _unless_handled(OSError(errno.ENOEXEC, os.strerror(errno.ENOEXEC), name))",
        "        return None",
        "no_program_raises_exec_format_error and cgroup",
    ),
    (
        "exec check: binfmt_misc handlers counted while the file system is switched off",
        "_exec_check.py",
        '            if status.read().strip() != "enabled":\n',
        "            if False:\n",
        "binfmt_misc_handler_leaves",
    ),
    (
        "spawn: a kernel without waitid(P_PIDFD) let through",
        "_spawn.py",
        "            raise\n        raise NotImplementedError(\n"
        '            "trio_proctree needs waitid',
        "            raise\n        return\n        raise NotImplementedError(\n"
        '            "trio_proctree needs waitid',
        "test_a_kernel_without_waitid_on_pidfds_is_refused_clearly",
    ),
    (
        "spawn: a pidfd that cannot be asked about its process left open",
        "_spawn.py",
        "    except BaseException:  # (EINVAL: a kernel without waitid(P_PIDFD), say)\n"
        "        os.close(pidfd)\n",
        "    except BaseException:  # (EINVAL: a kernel without waitid(P_PIDFD), say)\n",
        "test_a_pidfd_that_cannot_be_asked_about_its_process_is_not_leaked",
    ),
    (
        "watchdog: a failed spawn's members left running until we die",
        "_containment.py",
        "            elif not watchdog.kill_now(*self.backstop):\n",
        "            elif False:\n",
        "test_a_failed_spawn_whose_leader_had_started_a_member",
    ),
    (
        "spawn: a failed spawn whose leader had run taken for one that started nothing",
        "_choose.py",
        "        containment.release(emptied=False)\n",
        "        containment.release()\n",
        "test_a_failed_spawn_whose_leader_had_started_a_member",
    ),
    (
        "close: a refused SIGKILL at interpreter exit skips the leader's reap",
        "_core.py",
        '            logger.warning("%s: could not kill at interpreter exit: %s", core.label, exc)\n',
        '            logger.warning("%s: could not kill at interpreter exit: %s", core.label, exc)\n'
        "            continue\n",
        "test_a_tree_open_at_interpreter_exit_with_a_member_it_may_not_signal",
    ),
    (
        "escalation: no SIGCONT after the stop signal",
        "_containment.py",
        "            if wake:\n                os.killpg(self._pgid, signal.SIGCONT)\n",
        "",
        "stopped",
    ),
    (
        "cgroup: escapees not sent the SIGCONT that follows the stop signal",
        "_cgroup.py",
        "        step = [sig, signal.SIGCONT] if escalation else [sig]\n",
        "        step = [sig]\n",
        "test_stopped_escapee_gets_sigcont and cgroup",
    ),
    (
        "leader: reaped as soon as it exits",
        "_leader.py",
        "            info = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)",
        "            info = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG)",
        "test_exited_leader_keeps_its_pgid_reserved or test_reading_returncode_never_reaps",
    ),
    (
        "group: signalled after the leader was reaped",
        "_core.py",
        "        if self.leader.reaped or self._cleaned_up:\n",
        "        if self.leader.reaped or self._cleaned_up:\n            os.killpg(self.leader.pid, sig)\n",
        "test_recycled_pgid_is_never_signalled",
    ),
    (
        "group: no scan for members that outlive the leader",
        "_containment.py",
        "        if self._scan_after is None:\n            self._scan_after = time.monotonic_ns()\n            return NEED_SCAN",
        "        if self._scan_after is None:\n            return []",
        "lingering and group",
    ),
    (
        "cgroup: hard stop without cgroup.kill",
        "_cgroup.py",
        "        _kill(self.path)\n",
        "        pass\n",
        "ignoring_the_stop_signal and cgroup",
    ),
    (
        "cgroup: escapees not sent the stop signal",
        "_cgroup.py",
        "        new = self._survey(track=True, pins=pins, give=self._sent)\n"
        "        self._catch_up(new, self._sent, pins=pins)\n",
        "        self._survey(track=True, pins=pins, give=self._sent)\n",
        "test_stopped_escapee_gets_sigcont",
    ),
    (
        "cgroup: escapees not sent a signal the program sends",
        "_cgroup.py",
        "            self._signal_escapees([pid for pid in self._escapees if pid not in new], step)\n"
        "            try:\n"
        "                self._catch_up(new, catch_up, pins=pins)\n",
        "            try:\n                pass\n",
        "send_signal_reaches_an_escapee and (cgroup or auto)",
    ),
    (
        "subreaper: escapees not sent the stop signal",
        "_containment.py",
        "            self._signal_escapees(found, earlier)\n"
        "        self._signal_escapees(self._escapees, step)",
        "            self._signal_escapees(found, earlier)\n        pass",
        "test_stopped_escapee_gets_sigcont",
    ),
    (
        "cgroup: an escapee found late misses the stop signal",
        "_cgroup.py",
        "        list_now = self._survey_due or not self._members\n",
        "        list_now = self._survey_due\n",
        "started_during_the_stop and cgroup",
    ),
    (
        "subreaper: an escapee found late misses the stop signal",
        "_containment.py",
        "            self._signal_escapees(new_escapees, self._sent)",
        "            pass",
        "started_during_the_stop and subreaper",
    ),
    (
        "cgroup: called empty without reading cgroup.events",
        "_cgroup.py",
        "        if not self._members and not self._populated():\n"
        "            if self._unlisted is not None:",
        "        if not self._members:\n            if self._unlisted is not None:",
        "lingering and cgroup",
    ),
    (
        "lingering: a member outliving the leader into SIGKILL not counted",
        "_containment.py",
        "        if self.leader.exited:\n            self._mark_lingering()\n",
        "",
        "outlives_the_stopped and cgroup",
    ),
    (
        "lingering: counted after the step's signal, not before it",
        "_cgroup.py",
        "                listing_failed = exc\n            self._mark_lingering()\n",
        "                listing_failed = exc\n",
        "stopped_after_the_leader_exited and cgroup",
    ),
    (
        "subreaper: never set",
        "_orphans.py",
        "            result = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)",
        "            result = 0",
        "subreaper and (escapee or daemon)",
    ),
    (
        "subreaper: a process showing no environment stays undecided for good",
        "_subreaper.py",
        "        if seen >= listings:\n            return False",
        "        if False:\n            return False",
        "clears_its_environment",
    ),
    (
        "lost leader: its members get no stop signal",
        "_cgroup.py",
        "        self._signal_group(sig, pins=pins, wake=escalation)  # (a step: SIGCONT follows)",
        "        if pins:\n            self._group.signal_pinned(sig, wake=escalation)",
        "reaped_elsewhere and cgroup",
    ),
    (
        "trio: cleanup waits on the leader's pidfd without taking turns with wait()",
        "_trio.py",
        "        try:\n            lock.acquire_nowait()\n        except trio.WouldBlock:\n"
        "            await lock.acquire()  # a task is in wait(): it returns once the leader exits\n"
        "        try:\n            await trio.lowlevel.wait_readable(fd)\n"
        "        finally:\n            lock.release()\n",
        "        await trio.lowlevel.wait_readable(fd)\n",
        "takes_turns_with_a_task_waiting",
    ),
    (
        "trio: cleanup's waits not shielded",
        "_trio.py",
        "        with bound(timeout, virtual=self._virtual, shield=True):",
        "        with bound(timeout, virtual=self._virtual):",
        "block_scope_cancel_does_not_cut_cleanup_short",
    ),
    (
        "trio: the wait for a cleanup that already ran not shielded",
        "_trio.py",
        "            with trio.CancelScope(shield=True):\n                await self._cleanup_done.wait()",
        "            with trio.CancelScope():\n                await self._cleanup_done.wait()",
        "never_replaces_the_blocks_exception_after_aclose",
    ),
    (
        "cgroup: cgroup.events opened for each check (a new fd at teardown)",
        "_cgroup.py",
        "            if self._events_fd < 0:\n                return _populated(self._events)",
        "            if True:\n                return _populated(self._events)",
        "ends_with_its_leader_ends_cleanly",
    ),
    (
        "cgroup: members still exiting after the leader are listed, not waited for",
        "_cgroup.py",
        "            if (emptying := self._watch_emptying()) is not None:\n"
        "                return [emptying]\n",
        "",
        "still_exiting_after_the_leader",
    ),
    (
        "cgroup: cgroup.events held open however few file descriptors are left",
        "_cgroup.py",
        "    if fd < resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2:\n",
        "    if True:\n",
        "by_the_hundred",
    ),
    (
        "cgroup: with members tracked, a wait for a cgroup.events change not read (spins)",
        "_cgroup.py",
        "        if remaining <= 0 or young or self._events_fd < 0 or self._members:\n",
        "        if remaining <= 0 or young or self._events_fd < 0:\n",
        "without_spinning",
    ),
    (
        "cgroup: a failed listing of what outlived the leader skips the step's signal",
        "_cgroup.py",
        "            try:\n                new = self._survey(track=True, pins=pins, give=earlier)\n"
        "                listed = True\n            except OSError as exc:\n",
        "            new = self._survey(track=True, pins=pins, give=earlier)\n"
        "            try:\n                listed = True\n            except OSError as exc:\n",
        "lingering_member_still and cgroup",
    ),
    (
        "subreaper: a failed listing loses the step for escapees found later",
        "_containment.py",
        "            # is to die, and must not sit out cleanup's wait for it until the hard stop.\n"
        "            self._sent.extend(step)\n",
        "            # is to die, and must not sit out cleanup's wait for it until the hard stop.\n"
        "            self._sent.extend(step if listing_failed is None else [])\n",
        "descriptors_are_back and subreaper",
    ),
    (
        "cgroup: the deferred listing waits for the leader's exit without a bound",
        "_core.py",
        "                await io.wait_readable(pending[0], min(remaining, within or remaining))",
        "                await io.wait_readable(pending[0], remaining)",
        "leader_ignores_it and (cgroup or auto)",
    ),
    (
        "cgroup: no listing while the leader still runs",
        "_cgroup.py",
        "                    # The leader outlived SURVEY_DELAY (or a failed listing is tried again).\n"
        "                    self._try_survey_now()\n",
        "                    # The leader outlived SURVEY_DELAY (or a failed listing is tried again).\n"
        "                    pass\n",
        "leader_ignores_it and (cgroup or auto)",
    ),
    (
        "cgroup: the hard stop without the deferred listing",
        "_cgroup.py",
        "        if self._survey_due or not self._surveyed:\n            # The graceful wait ended",
        "        if not self._surveyed:\n            # The graceful wait ended",
        "counted_with_no_grace and (cgroup or auto)",
    ),
    (
        "cgroup: an escapee a program's signal finds gets only that signal",
        "_cgroup.py",
        "        catch_up = self._sent if replayed else [*self._sent, sig]",
        "        catch_up = self._sent if replayed else [sig]",
        "(program_finds_during_cleanup or during_cleanup_does_not_hold_back) and (cgroup or auto)",
    ),
    (
        "subreaper: an escapee a program's signal finds gets only that signal",
        "_containment.py",
        "            self._signal_escapees(found, earlier)\n",
        "            pass\n",
        "program_finds_during_cleanup and subreaper",
    ),
    (
        "cgroup: a member found after the program's kill is not given SIGKILL",
        "_cgroup.py",
        "        replayed = escalation or sig == signal.SIGKILL\n",
        "        replayed = escalation\n",
        "found_after_the_programs_kill and (cgroup or auto)",
    ),
    (
        "subreaper: a member found after the program's kill is not given SIGKILL",
        "_containment.py",
        "        if escalation or sig == signal.SIGKILL:\n",
        "        if escalation:\n",
        "found_after_the_programs_kill and subreaper",
    ),
    (
        "watchdog: trees never registered",
        "_watchdog.py",
        '            _write(_started(), ("+" + entry for entry in entries))\n',
        "            pass\n",
        "parent_killed",
    ),
    (
        "watchdog: a subreaper tree's group not registered",
        "_containment.py",
        "    backstop_needs_group = True\n",
        "    backstop_needs_group = False\n",
        "members_without_environment",
    ),
    (
        # (The home's removal goes too: it would remove the empty tree cgroup on its own.)
        "watchdog: a killed cgroup left in place for a late join",
        "_watchdog.py",
        "remove_cgroups(cgroups)\ndeadline = time.monotonic() + 0.5\n"
        "if markers:\n    kill_marked(set(markers), deadline)\n"
        "if killing_now.is_alive():\n"
        "    killing_now.join()  # (the cgroups it removes are in a home)\n"
        'for home in homes:\n    removed(home)\n"""',
        "deadline = time.monotonic() + 0.5\n"
        'if markers:\n    kill_marked(set(markers), deadline)\n"""',
        "before_its_leader_joined",
    ),
    (
        "watchdog: the home of a killed process left behind",
        "_watchdog.py",
        'for home in homes:\n    removed(home)\n"""',
        '"""',
        "leaves_no_cgroup_behind",
    ),
    (
        "watchdog: a member caught mid-exec taken for a stranger",
        "_watchdog.py",
        "    return BLANK\n",
        "    return None\n",
        "caught_mid_exec",
    ),
    (
        "cli: a stop request during a stop under way waits it out",
        "_cmd_run.py",
        "        if stopping.is_set() or len(requested) > 1:\n            tree.kill()\n        else:\n",
        "        if True:\n",
        "under_way",
    ),
    (
        "cli: an interrupted demo exits 128+N instead of ending by the signal",
        "_cli.py",
        "            return end_by(stopped.signal)",
        "            return 128 + stopped.signal",
        "interrupted_demo",
    ),
    (
        "cli: exits 128+N instead of ending by the signal",
        "_cmd_run.py",
        "    return end_by(-returncode) if returncode < 0 else returncode",
        "    return 128 - returncode if returncode < 0 else returncode",
        "bash_script or ends_by_the_signal",
    ),
    (
        "spawn: out of file descriptors taken for an old kernel",
        "_spawn.py",
        "        if exc.errno not in _NOT_OFFERED:\n            raise\n",
        "",
        "first_tree_is_said",
    ),
    (
        "demo: SIGTERM ends it at once, its uncontained trees left running",
        "_demo.py",
        "INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, *PASSED_ON)",
        "INTERRUPTS = (signal.SIGINT, signal.SIGHUP, *PASSED_ON)",
        "interrupted_demo",
    ),
    (
        "demo: SIGUSR1 ends it at once, its uncontained trees left running",
        "_demo.py",
        "INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, *PASSED_ON)",
        "INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)",
        "interrupted_demo",
    ),
    (
        "cli: the terminal taken from the other commands of a pipeline",
        "_job_control.py",
        "        leads = os.tcgetpgrp(fd) == os.getpgrp() == ours and _alone_in_group(ours)\n",
        "        leads = os.tcgetpgrp(fd) == os.getpgrp() == ours\n",
        "leading_a_pipeline",
    ),
    (
        "cli: the terminal handed over without waking a stopped reader",
        "_job_control.py",
        "        self.group = group\n        self.resume()\n",
        "        self.group = group\n        os.tcsetpgrp(self.fd, group)\n",
        "read_it_too_soon or read_the_terminal_before_the_hand_over",
    ),
    (
        "cli: only a terminal on stdin is handed to the command",
        "_job_control.py",
        '        fd = os.open("/dev/tty", ',
        '        fd = 0 if os.isatty(0) else os.open("/dev/null", ',
        "stdin_redirected",
    ),
    (
        "cli: Ctrl-Z stops an interactive command alone, the shell waits for ever",
        "_cmd_run.py",
        "        *(job_control if interactive else ()),\n",
        "",
        "ctrl_z_stops_run",
    ),
    (
        "cli: a tool continued in the background hands its command the terminal",
        "_job_control.py",
        "            if self.given and os.tcgetpgrp(self.fd) == os.getpgrp():\n",
        "            if self.given:\n",
        "background_stops_when_it_reads or keeps_off_the_terminal",
    ),
    (
        "cli: a tool ending in the background takes the terminal from the shell",
        "_job_control.py",
        "                    if foreground != os.getpgrp() and (\n",
        "                    if True or (\n",
        "ending_in_the_background",
    ),
    (
        "cli: the tool stops alone, not the job that runs it",
        "_job_control.py",
        "            os.killpg(ours, sig)\n",
        "            os.kill(os.getpid(), sig)\n",
        "script_that_runs_the_tool",
    ),
    (
        "cli: a continued job's tree continued whole, not its group",
        "_cmd_run.py",
        "                    terminal.resume()\n",
        "                    terminal.resume()\n                    tree.send_signal(signal.SIGCONT)\n",
        "not_members_stopped_elsewhere",
    ),
    (
        "cli: a tool no shell can continue follows a SIGSTOP",
        "_job_control.py",
        "        if _orphaned(ours):\n",
        "        if False:\n",
        "sigstop_with_no_shell",
    ),
    (
        "cli: a stop for the terminal the tool holds stops the job",
        "_job_control.py",
        "            if sig in (signal.SIGTTIN, signal.SIGTTOU) and os.tcgetpgrp(self.fd) == ours:\n",
        "            if False:\n",
        "brought_back_running",
    ),
    (
        "cli: a Ctrl-Z that reached the tool leaves the tree running",
        "_cmd_run.py",
        "                    terminal.stop_the_tree()\n",
        "                    pass\n",
        "brought_back_running",
    ),
    (
        "cli: the terminal taken back before the tree is stopped",
        "_cmd_run.py",
        "                stopping.set()\n",
        "                stopping.set()\n                if terminal is not None:\n                    os.tcsetpgrp(terminal.fd, os.getpgrp())\n",
        "keeps_the_terminal_until",
    ),
    (
        "asyncio: Ctrl-C at the loop's shutdown lets the grace run out",
        "asyncio.py",
        "            isinstance(context, KeyboardInterrupt) and context is not self._interrupt_before\n",
        "            False\n",
        "asyncio_programs_end",
    ),
    (
        "asyncio: an interrupt handled before the cleanup began cuts its grace short",
        "asyncio.py",
        "            isinstance(context, KeyboardInterrupt) and context is not self._interrupt_before\n",
        "            isinstance(context, KeyboardInterrupt)\n",
        "earlier_ctrl_c",
    ),
    (
        "cli: a tool whose caller shares its group gives the tree the terminal at once",
        "_job_control.py",
        "os.tcgetpgrp(fd) == os.getpgrp() == ours and",
        "os.tcgetpgrp(fd) == os.getpgrp() and",
        "python_program or loop_at_a_terminal",
    ),
    (
        "cli: a tree's death by Ctrl-C not passed on to the caller",
        "_cmd_run.py",
        "                            terminal.pass_on(-returncode)  # (its Ctrl-C, to a caller)\n",
        "                            pass\n",
        "loop_at_a_terminal",
    ),
    (
        "cli: a tool in the background gives its tree a session of its own",
        "_job_control.py",
        "    terminal = Terminal(fd, leads=leads)\n",
        "    if os.tcgetpgrp(fd) != os.getpgrp():\n        os.close(fd)\n        yield None\n        return\n    terminal = Terminal(fd, leads=leads)\n",
        "in_the_background_stops",
    ),
    (
        "cli: the terminal left to a dead job's group",
        "_job_control.py",
        "                        foreground == self.group or not _has_live_members(foreground)\n",
        "                        foreground == self.group\n",
        "job_of_a_shell",
    ),
    (
        "cli: a reader's stop for the terminal does not make it the tree's",
        "_job_control.py",
        "                self.given = True\n",
        "",
        "script_still_hands or in_the_background_stops",
    ),
    (
        "cli: SIGQUIT, SIGUSR1 and the like end the tool without its cleanup",
        "_cmd_run.py",
        "        *(sig for sig in (*STOP_REQUESTS, *PASSED_ON) if signal.getsignal(sig) != signal.SIG_IGN),\n",
        "        *(sig for sig in STOP_REQUESTS if signal.getsignal(sig) != signal.SIG_IGN),\n",
        "sigquit or act_on_is_passed",
    ),
    (
        "cli: a signal inherited ignored taken for a stop request",
        "_cmd_run.py",
        "        *(sig for sig in (*STOP_REQUESTS, *PASSED_ON) if signal.getsignal(sig) != signal.SIG_IGN),\n",
        "        *(*STOP_REQUESTS, *PASSED_ON),\n",
        "inherited_ignored",
    ),
    (
        "cli: a tree's own death by SIGINT, away from the terminal, passed on as Ctrl-C",
        "_job_control.py",
        "        if not self.held_by_the_tree():  # (its zombie leader, unreaped, pins the group)\n            return\n",
        "",
        "away_from_the_terminal",
    ),
    (
        "cgroup: a later image of the process reuses its former home",
        "_cgroup.py",
        "        image = os.urandom(4).hex()\n"
        '        name = f"{_HOME_PREFIX}{_pid_namespace()}-{pid}-{_started(stat)}-{image}"\n'
        "        path = os.path.join(parent, name)\n"
        "        try:\n"
        "            os.mkdir(path)\n"
        "        except FileExistsError:  # pragma: no cover - a token drawn twice\n"
        "            continue\n",
        '        image = "same"\n'
        '        name = f"{_HOME_PREFIX}{_pid_namespace()}-{pid}-{_started(stat)}-{image}"\n'
        "        path = os.path.join(parent, name)\n"
        "        try:\n"
        "            os.mkdir(path)\n"
        "        except FileExistsError:  # the home of a former image, reused\n"
        "            break\n",
        "never_reuses_its_former",
    ),
    (
        "pidfd: an exited process is an error",
        "_containment.py",
        "        signal.pidfd_send_signal(pidfd, sig)\n    except ProcessLookupError:\n        pass",
        "        signal.pidfd_send_signal(pidfd, sig)\n    except ProcessLookupError:\n        raise",
        "just_exited",
    ),
    (
        "wait: a sleep-poll instead of the pidfd",
        "_trio.py",
        "    async def wait_readable(self, fd: int, timeout: float) -> None:\n",
        "    async def wait_readable(self, fd: int, timeout: float) -> None:\n"
        "        await trio.sleep(min(timeout, 0.02))\n"
        "        return\n",
        "test_a_longer_grace_costs_no_extra_wakeups",
    ),
    (
        "fork: the child's exit kills the parent's trees",
        "_core.py",
        "    _open_trees.clear()",
        "    pass",
        "forked_child",
    ),
    (
        "sweep: homes of another pid namespace taken for stale",
        "_cgroup.py",
        "        if home_namespace != namespace:\n            if live_namespaces is None:",
        "        if False:\n            if live_namespaces is None:",
        "another_pid_namespace",
    ),
    (
        "sweep: a former image's home left for good",
        "_cgroup.py",
        "            if owner != os.getpid() or (current is not None and current.path == home):\n",
        "            if True:\n",
        "stale_cgroup_of_a_dead_owner",
    ),
    (
        "interrupt: Ctrl-C abandons the cleanup",
        "_trio.py",
        "        except KeyboardInterrupt as interrupt:",
        "        except ZeroDivisionError as interrupt:",
        "ctrl_c",
    ),
    (
        "spawn: the worker thread's result lost when its task is cancelled",
        "asyncio.py",
        "        cancelled = await _through_cancellation(forking)",
        "        cancelled = None\n        await forking",
        "whose_tasks_are_all_cancelled",
    ),
    (
        "subreaper: our children read once a listing, a double-forking daemon missed",
        "_subreaper.py",
        "            if not roots and len(known) == read_before:",
        "            if not roots:",
        "keeps_double_forking_is_killed",
    ),
    (
        "watchdog: a pass finding nobody ends the search, a double-forking daemon missed",
        "_watchdog.py",
        "        elif (misses := misses + 1) > MISSES:",
        "        elif (misses := misses + 1) > 0:",
        "keeps_double_forking_along",
    ),
    (
        "close: a cleanup cancelled before it began never begins",
        "_begins_anyway.py",
        "        if not self._begun and isinstance(cancellation, asyncio.CancelledError):",
        "        if False:",
        "before_its_first_step_runs or nobody_awaits",
    ),
    (
        "fds: a failed listing skips the group's signal",
        "_containment.py",
        "                # killpg needs none); the error is raised after it.\n"
        "                listing_failed = exc",
        "                # killpg needs none); the error is raised after it.\n                raise",
        "file_descriptors and subreaper",
    ),
    (
        "direct start: a killed tree's cgroup reused [glibc]",
        "_cgroup.py",
        "            if not (killed and direct_spawn.available()):",
        "            if True:",
        "starts_after_the_one_before_was_killed",
    ),
    (
        "direct start: no emptied cgroup reused [glibc]",
        "_cgroup.py",
        "            if not (killed and direct_spawn.available()):",
        "            if not direct_spawn.available():",
        "emptied_without_a_kill",
    ),
    (
        "direct start: a leader killed at birth taken for started [glibc]",
        "_spawn_into_cgroup.py",
        "    if request.reused and _died_before_exec(pid):",
        "    if False:",
        "killed_itself",
    ),
    (
        "direct start: never proven with a throwaway child [glibc]",
        "_spawn_into_cgroup.py",
        "    if not _proven:\n        _prove(glibc, request)",
        "    if False:\n        _prove(glibc, request)",
        "die_at_birth",
    ),
    (
        "subreaper: an env-less child of ours costs every teardown again",
        "_subreaper.py",
        "        seen = _no_environment_seen.get(key, 0)",
        "        seen = 0",
        "slows_one_subreaper_teardown_only",
    ),
    (
        "subreaper: env={} taken for no env given",
        "_subreaper.py",
        "        if env is None:  # (not `or`",
        "        if not env:  # (not `or`",
        "empty_environment_stays_empty and subreaper",
    ),
    (
        "subreaper: orphans never reaped",
        "_orphans.py",
        "            try:\n                os.waitpid(child, os.WNOHANG)",
        "            try:\n                pass",
        "zombies",
    ),
    (
        "subreaper: other code's exited children reaped",
        "_orphans.py",
        "        if stat is not None and ours(stat):\n"
        "            # Read again before the reap: a kept stat must never have us reap another's.\n"
        "            _zombies.pop(child, None)\n"
        "            stat = read_stat(child)\n"
        "            if stat is None or stat.alive or not ours(stat):",
        "        if stat is not None:\n"
        "            _zombies.pop(child, None)\n"
        "            stat = read_stat(child)\n"
        "            if stat is None or stat.alive:",
        "left_for_it_to_reap",
    ),
    (
        "cgroup: hard stop by cgroup.kill alone (misses a main thread's exit)",
        "_cgroup.py",
        "            for pid in _main_thread_gone(self.path):",
        "            for pid in []:",
        "main_thread_exited_is_still_stopped and cgroup-True",
    ),
    (
        "subreaper: environment read from the main thread only",
        "_procfs.py",
        "        if (other := _environ_of_other_threads(pid)) is None:",
        "        if True:",
        "main_thread_exited_is_still_stopped and subreaper",
    ),
    (
        "watchdog: cgroup.kill alone (misses a main thread's exit)",
        "_watchdog.py",
        "            if pid in still:",
        "            if False:",
        "main_thread_exited_along and cgroup",
    ),
    (
        "watchdog: environment read from the main thread only",
        "_watchdog.py",
        "    if not env:  # (None: that thread has exited, or the process has)",
        "    if False:",
        "main_thread_exited_along and subreaper",
    ),
    (
        "subreaper: a child whose main thread exited taken for dead",
        "_orphans.py",
        "        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None",
        "        return (stat := read_stat(pid)) is None or stat.state in 'ZX'",
        "main_thread_exited_is_still_stopped and subreaper",
    ),
    (
        "subreaper: the other trees' leaders read like any child",
        "_leader.py",
        "    return leader is not None and leader.pins_group",
        "    return False",
        "other_trees_leaders",
    ),
    (
        "subreaper: a leader kept listed once reaped",
        "_leader.py",
        "        if _unreaped.get(self.pid) is self:",
        "        if False:",
        "leaves_nothing_of_its_leader",
    ),
    (
        "subreaper: every thread's children read in each listing",
        "_orphans.py",
        "    if threading.get_native_id() != pid:  # (else we run in the main thread: it lives)",
        "    if True:\n        return children(pid)\n    if threading.get_native_id() != pid:",
        "two_threads_of_ours",
    ),
    (
        "subreaper: only the main thread's children read after it has exited",
        "_orphans.py",
        "        if main is None or not main.main_thread_alive:",
        "        if main is None:",
        "main_thread_has_exited",
    ),
    (
        "subreaper: only the main thread's children read of a member of two threads",
        "_orphans.py",
        "    if stat.threads != 1 or not stat.main_thread_alive:",
        "    if not stat.main_thread_alive:",
        "while_its_parent_lives and second-thread",
    ),
    (
        "subreaper: a one-thread member's children not read",
        "_orphans.py",
        "        return _thread_children(stat.pid, stat.pid)\n",
        "        return []\n",
        "while_its_parent_lives and one-thread",
    ),
    (
        "subreaper: a kept zombie stat trusted at a pid a new zombie took",
        "_orphans.py",
        "    if (known := _zombies.get(pid)) is not None and known[0] == inode:",
        "    if (known := _zombies.get(pid)) is not None:",
        "zombie_at_a_pid",
    ),
    (
        "subreaper: kept zombie stats never forgotten",
        "_orphans.py",
        "    for gone in _zombies.keys() - set(listed):  # reaped since, by their own code",
        "    for gone in ():",
        "reaped_by_its_own_code_is_forgotten",
    ),
    (
        "spawn: where a program was found on PATH trusted without a look",
        "_spawn.py",
        "        and look_at(known.path) == EXECUTABLE\n",
        "",
        "looked_for_again_once_gone",
    ),
    (
        "subreaper: the children of the thread that forked the leader not read",
        "_subreaper.py",
        "        for child in adopted_children(also=[self.leader.parent_thread]):",
        "        for child in adopted_children():",
        "leader_started_as_its_sibling",
    ),
    (
        "watchdog: a group killed whenever its leader started",
        "_watchdog.py",
        "    if fields is not None and earliest <= int(fields[19]) <= latest:  # it pins the pgid",
        "    if fields is not None:",
        "only_if_its_leader_started",
    ),
    (
        "subreaper: the watchdog read like any child of ours",
        "_subreaper.py",
        "            if child == leader or is_unreaped_leader(child) or is_watchdog(child):",
        "            if child == leader or is_unreaped_leader(child):",
        "test_a_subreaper_teardown_reads_nothing_of_the_watchdog",
    ),
    (
        "subreaper: the walk's pins dropped, each new member pinned again",
        "_containment.py",
        "        if (pinned := self._pinned.pop(pid, None)) is not None:",
        "        if (pinned := self._pinned.pop(pid, None)) is not None and False:",
        "test_a_subreaper_listing_reads_each_new_members_stat_once",
    ),
    (
        "procfs: a stat read cut at its first read",
        "_procfs.py",
        "            if len(first) < _WHOLE_READ:",
        "            if len(first) <= _WHOLE_READ:",
        "test_a_file_read_as_made_whole_is_read_to_its_end",
    ),
    (
        "watchdog: a group killed by its number alone (missed once init reaps the leader)",
        "_watchdog.py",
        '    if kind == b"group" and live[entry] is not None:',
        '    if kind == b"group" and False:',
        "test_the_watchdog_kills_a_group_whose_leader_init_reaped_first",
    ),
    (
        "watchdog: a group's leader pinned whenever it started",
        "_watchdog.py",
        "    if fields is None or not earliest <= int(fields[19]) <= latest:\n        os.close(fd)",
        "    if fields is None:\n        os.close(fd)",
        "test_the_watchdog_kills_a_group_only_if_its_leader_started_when_registered",
    ),
    (
        "group: a reaped leader's group id trusted without asking its group",
        "_containment.py",
        "        if found and not self._leader.pins_group and not self.group_lives():",
        "        if found and not self._leader.pins_group and False:",
        "test_an_emptied_group_of_a_reaped_leader_is_never_taken_for_one_with_its_id",
    ),
    (
        "group: a reaped leader's group given up, not reached through its pidfd",
        "_containment.py",
        "        try:\n            signal_group_of(self._leader.pidfd, sig)",
        "        try:\n            raise OSError('mutant')\n            signal_group_of(self._leader.pidfd, sig)",
        "test_a_tree_whose_leader_was_reaped_elsewhere_is_still_stopped_gracefully",
    ),
    (
        "watchdog: pins fill its descriptor table, leaving none for the markers",
        "_watchdog.py",
        "PINS_AT_MOST = hard - min(256, hard // 2)",
        "PINS_AT_MOST = hard",
        "test_a_watchdog_short_of_file_descriptors_still_kills_every_registered_process",
    ),
    (
        "subreaper: a listing that failed with pins in hand not taken again without them",
        "_containment.py",
        "                if not self._pinned:\n                    raise\n",
        "                raise\n",
        "test_short_of_file_descriptors_every_escapee_there_is_room_for_gets_the_stop_signal",
    ),
    (
        "group: a reaped leader's group signalled by its id",
        "_containment.py",
        "            signal_group_of(self._leader.pidfd, sig)\n            if wake:",
        "            os.killpg(self._pgid, sig)\n            if wake:",
        "test_an_emptied_group_of_a_reaped_leader_is_never_taken_for_one_with_its_id",
    ),
    (
        "procfs: a /proc of another pid namespace trusted",
        "_choose.py",
        "    if (foreign := foreign_proc()) is not None:",
        "    if (foreign := foreign_proc()) is not None and False:",
        "test_under_a_proc_of_another_pid_namespace_no_tree_starts",
    ),
    (
        "procfs: whose /proc it is asked once, not once per process",
        "_procfs.py",
        "    os.register_at_fork(after_in_child=_forget_whose_proc)",
        "    pass",
        "test_a_forked_child_in_a_new_pid_namespace_asks_again_whose_proc_it_is",
    ),
    (
        "cli: orphans listed from a /proc of another pid namespace",
        "_cli.py",
        '    if args.command in ("demo", "orphans") and',
        '    if args.command in ("demo",) and',
        "test_under_a_proc_of_another_pid_namespace_the_demo_and_orphans_refuse",
    ),
    (
        "members: a reaped leader's group members taken for escapees",
        "_containment.py",
        "            if stat.pgid == leader.pid and (leader.pins_group or self._group_lives(listed=listed)):",
        "            if stat.pgid == leader.pid and leader.pins_group:",
        "test_a_reaped_leaders_group_member_is_stopped_as_a_member_not_an_escapee",
    ),
    (
        "members: a reaped leader's group not signalled through its pidfd",
        "_containment.py",
        "            else:\n                self._group.signal_through_leader(sig, wake=wake)",
        "            else:\n                return",
        "test_a_reaped_leaders_group_member_is_stopped_as_a_member_not_an_escapee",
    ),
    (
        "members: a refusal to signal the group raised before the hard stop",
        "_containment.py",
        "        self._signal_group(signal.SIGKILL, pins=pins)\n        self._sent.append(signal.SIGKILL)",
        "        self._signal_group(signal.SIGKILL, pins=pins)\n        self._raise_denied()",
        "test_a_group_of_another_user_is_still_hard_stopped_by_its_cgroup",
    ),
    (
        "members: a refusal to signal kept and never raised",
        "_containment.py",
        "        if denied is not None:\n            raise denied",
        "        if denied is not None:\n            pass",
        "test_a_group_of_another_user_is_still_hard_stopped_by_its_cgroup",
    ),
    (
        "core: a signal sent through a tree after its cleanup",
        "_core.py",
        "        if self.leader.reaped or self._cleaned_up:",
        "        if self.leader.reaped:",
        "test_a_signal_after_cleanup_of_a_tree_whose_leader_was_reaped_elsewhere_is_a_no_op",
    ),
    (
        "spawn: a pidfd opened by the leader's pid trusted to name our child",
        "_spawn.py",
        "    except ChildProcessError:\n        os.close(pidfd)\n        return None\n",
        "    except ChildProcessError:\n        pass\n",
        "test_a_leader_reaped_before_its_pidfd_opened_never_lends_its_group_a_strangers",
    ),
    (
        "spawn: a leader reaped before its pidfd opened taken for a failed spawn",
        "_spawn.py",
        "        return None  # reaped already, and the pid not a process's again (yet)",
        "        raise ProcessLookupError(pid)",
        "test_a_leader_reaped_before_its_pidfd_opened_is_reported_lost_not_a_failed_spawn",
    ),
    (
        "spawn: a leader's pid now a thread's taken for a failed spawn",
        "_spawn.py",
        "    if (pidfd := open_pidfd(pid)) is None:",
        "    if (pidfd := os.pidfd_open(pid)) is None:",
        "test_a_leader_reaped_before_its_pidfd_opened_and_its_pid_a_threads_is_lost",
    ),
    (
        "watchdog: the group of a leader reaped before its pidfd opened registered",
        "_containment.py",
        "        if lost or self.backstop:\n            return\n",
        "        if self.backstop:\n            return\n",
        "test_a_leader_reaped_before_its_pidfd_opened_is_no_group_for_the_watchdog",
    ),
    (
        "group: what a leader reaped before its pidfd opened left alone not said",
        "_containment.py",
        "                self._left_alone = max(self._left_alone, len(found))",
        "                pass",
        "test_a_leader_reaped_before_its_pidfd_opened_never_lends_its_group_a_strangers",
    ),
    (
        "members: a reaped leader's group member that died unseen left unreaped",
        "_containment.py",
        "            self._leader.pins_group or self._group.group_lives()\n        )",
        "            self._leader.pins_group\n        )",
        "test_a_reaped_leaders_group_member_that_died_unseen_is_reaped",
    ),
    (
        "spawn: a leader without a pidfd killed by its pid though reaped elsewhere",
        "_spawn.py",
        "    reaped_elsewhere = not _unreaped_child(pid)",
        "    reaped_elsewhere = False",
        "test_a_leader_whose_pidfd_cannot_open_is_stopped_only_if_still_ours",
    ),
    (
        "subreaper: a reaped leader's group members left to their marker",
        "_subreaper.py",
        "        if stat.pgid == self.leader.pid and (\n            self.leader.pins_group or self._group_lives(listed=listed)\n        ):",
        "        if stat.pgid == self.leader.pid and (\n            self.leader.pins_group\n        ):",
        "test_a_reaped_leaders_group_member_is_stopped_as_a_member_not_an_escapee",
    ),
    (
        "subreaper: a reaped leader's emptied group taken to live on",
        "_subreaper.py",
        "        if stat.pgid == self.leader.pid and (\n            self.leader.pins_group or self._group_lives(listed=listed)\n        ):",
        "        if stat.pgid == self.leader.pid and (\n            self.leader.pins_group or True\n        ):",
        "test_under_a_subreaper_an_emptied_group_of_a_reaped_leader_is_never_taken_for_one_with_its_id",
    ),
    (
        "members: a reaped leader's group asked about once a member",
        "_containment.py",
        "        if not listed or self._lives_for_listed is None:",
        "        if True:",
        "test_a_reaped_leaders_group_is_asked_about_once_a_listing_not_once_a_member",
    ),
    (
        "procfs: a /proc that does not show us taken for ours",
        "_procfs.py",
        '        return (\n            "/proc does not show this process',
        '        return None\n        return (\n            "/proc does not show this process',
        "test_under_a_proc_of_a_child_pid_namespace_no_tree_starts",
    ),
    (
        "core: a leader's pidfd left open once its tree ended",
        "_core.py",
        "                os.close(pidfd)",
        "                pass",
        "test_trees_started_one_after_another",
    ),
    (
        "choose: our own user= taken for another user's",
        "_spawn.py",
        "    if user is not None and user != os.geteuid():",
        "    if user is not None:",
        "test_a_leader_running_as_ourselves_keeps_its_cgroup",
    ),
    (
        "spawn: extra_groups= read in place (an iterator reaches Popen used up)",
        "_spawn.py",
        '    extra_groups = options["extra_groups"] = list(extra_groups)',
        "    pass",
        "as_an_iterator_reach_the_leader_whole",
    ),
    (
        "trio: the block's exit not protected from KeyboardInterrupt",
        "_trio.py",
        "    @trio.lowlevel.enable_ki_protection  # (see _aclose_under)\n",
        "",
        "test_ctrl_c_as_the_block_exits_still_stops_the_tree",
    ),
    (
        "escalation: a stream put in place of stdin closed without a bound",
        "_trio.py",
        "                await io._kept(stream.aclose, timeout=max(within, 0.0))",
        "                await io._kept(stream.aclose)",
        "cannot_hold_cleanup_past_its_bound",
    ),
    (
        "escalation: the wait after closing stdin counted from the end of the close",
        "_core.py",
        "io, action, errors, since=closed_stdin_at, leader_step=leader_step",
        "io, action, errors, since=None, leader_step=leader_step",
        "cannot_hold_cleanup_past_its_bound",
    ),
    (
        "spawn: a spawn still queued for a worker awaited through a cancellation",
        "asyncio.py",
        "            if drop():\n                return cancelled",
        "            if False:\n                return cancelled",
        "still_queued_for_a_worker_thread",
    ),
    (
        "subreaper: members recognised by their command line",
        "_subreaper.py",
        "        verdict = _environment_has(stat.pid, self._marker_entry)\n",
        '        if b"sleep" in open(f"/proc/{stat.pid}/cmdline", "rb").read():  # noqa\n'
        "            return True\n"
        "        verdict = _environment_has(stat.pid, self._marker_entry)\n",
        "sibling_with_the_same_command_line",
    ),
    (
        "cgroup: a kept cgroup serves again whatever a member set in it",
        "_cgroup.py",
        "                as_new = _as_new(kept)\n",
        "                as_new = True\n",
        "settings_a_member_changed",
    ),
    (
        "cleanup: a cleanup error made the cause of an exception with a context in view",
        "_outcome.py",
        "    if exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__):",
        "    if exc.__cause__ is None:",
        "stays_in_its_traceback",
    ),
    (
        "scope: never marked entered, a second entry starts a second tree (trio)",
        "_trio.py",
        "        self._entered = True\n",
        "        self._entered = False\n",
        "entered_twice",
    ),
    (
        "scope: never marked entered, a second entry starts a second tree (asyncio)",
        "asyncio.py",
        "        self._entered = True\n",
        "        self._entered = False\n",
        "entered_twice",
    ),
    (
        "cleanup: a grace cut short by Ctrl-C reported as run out",
        "_core.py",
        "                return CutShort(wait.timeout - remaining)",
        "                return False",
        "ctrl_c_during_the_grace or asyncio_programs_end",
    ),
    (
        "cgroup: the sweep removes a killed stale cgroup before its members died",
        "_cgroup.py",
        "                    _until_emptied(tree, within=STALE_KILL_WAIT)",
        "                    pass",
        "stale_cgroup",
    ),
    (
        "asyncio: a Ctrl-C before the cleanup's first step not seen",
        "_begins_anyway.py",
        "            if cancellation.__context__ is None:",
        "            if False:",
        "first_step_cuts",
    ),
    (
        "scope: a scope whose spawn failed stays entered (trio)",
        "_trio.py",
        "            self._entered = False\n            raise",
        "            raise",
        "entered_again",
    ),
    (
        "scope: a scope whose spawn failed stays entered (asyncio)",
        "asyncio.py",
        "            self._entered = False\n            raise",
        "            raise",
        "entered_again",
    ),
    (
        "plugin: multiprocessing's forkserver and resource tracker taken for leaks",
        "pytest_plugin.py",
        "    ours = {watchdog.pid for watchdog in _watchdog.running()} | _session_helpers()\n",
        "    ours = {watchdog.pid for watchdog in _watchdog.running()}\n",
        "multiprocessings_own",
    ),
    (
        "orphans: a command line shown as it is, its newlines forging rows",
        "_cmd_orphans.py",
        "{_age(o.age):>9}  {on_one_line(o.command)}",
        "{_age(o.age):>9}  {o.command}",
        "newline_in_a_command_line",
    ),
    (
        "cleanup: no note for an exception with a cause of its own",
        "_outcome.py",
        "            exc.add_note(note)\n",
        "            pass\n",
        "existing_cause_is_kept",
    ),
    (
        "cleanup: no line saying what it did",
        "_core.py",
        "        if logger.isEnabledFor(level):  # (building the message costs, on this path)\n",
        "        if False:\n",
        "debug_summary or logged_with_the_containment",
    ),
    (
        "close: anyio's backend imported for a shield no scope needs",
        "asyncio.py",
        "    if _ANYIO_ON_ASYNCIO not in sys.modules:\n        return None",
        "    if False:\n        return None",
        "merely_imported",
    ),
    (
        "cgroup: a failed listing raised at once, though the tree then ended cleanly",
        "_cgroup.py",
        "            self._hold(exc)\n            return False",
        "            raise",
        "slow_to_stop_ends_cleanly or found_once_descriptors_are_back",
    ),
    (
        "cgroup: a listing that failed all through the grace not said by the hard stop",
        "_cgroup.py",
        "        # signal: said once the hard stop (which reaches them) has gone out.\n"
        "        unlisted, self._unlisted = self._unlisted, None\n",
        "        # signal: said once the hard stop (which reaches them) has gone out.\n"
        "        unlisted, self._unlisted = None, None\n",
        "listing_that_never_worked",
    ),
    (
        "cgroup: a step's failed listing raised at once, though the tree then ended cleanly",
        "_cgroup.py",
        "            self._hold(listing_failed)",
        "            raise listing_failed",
        "lingering_member_still_gets_the_stop_signal",
    ),
    (
        "cgroup: the escapees a listing found before it failed get no signal",
        "_cgroup.py",
        "        except OSError:\n            self._signal_escapees(new, give)\n            raise",
        "        except OSError:\n            raise",
        "escapees_a_failed_listing_found and cgroup",
    ),
    (
        "subreaper: the escapees a listing found before it failed get no signal",
        "_containment.py",
        "        except OSError:\n            self._signal_escapees(new_escapees, give)\n            raise",
        "        except OSError:\n            raise",
        "escapees_a_failed_listing_found and subreaper",
    ),
    (
        "kill(): cleanup takes a tree the program killed for a running one and signals it",
        "_core.py",
        "        self._killed |= sig == signal.SIGKILL",
        "        pass",
        "program_killed",
    ),
    (
        "group: a member dying of the program's kill() counted as left behind by the leader",
        "_containment.py",
        "            # dying of it, and lingers only if still running at cleanup's hard stop.\n"
        "            self._stepped = True",
        "            # dying of it, and lingers only if still running at cleanup's hard stop.\n"
        "            pass",
        "program_killed and group",
    ),
    (
        "watchdog: a killed cgroup waited on by its cgroup.events alone",
        "_watchdog.py",
        "            poller.poll(1000 * min(left, 0.005))",
        "            poller.poll(1000 * left)",
        "someone_else_removes",
    ),
    (
        "pytest plugin: a child that was only dying left a zombie",
        "pytest_plugin.py",
        "        for fd in ended:\n            _reap_if_ours(fd)\n",
        "",
        "still_dying_when_its_test_ends",
    ),
    (
        "asyncio run: an error that ended a reader never raised",
        "asyncio.py",
        "    if errors := await _end_io(io_tasks, taken):",
        "    if (errors := await _end_io(io_tasks, taken)) and False:",
        "raises_an_error_that_ended_its_reading",
    ),
    (
        "asyncio run: a failed reader's pipe left open for the tree to block on",
        "asyncio.py",
        "                readers[-1].add_done_callback(functools.partial(_close_if_failed, transport))",
        "                pass",
        "raises_an_error_that_ended_its_reading",
    ),
    (
        "trio run: a pipe handed back by nursery.start closed by cleanup",
        "_trio.py",
        "        if stream is None or any(stream is kept for kept in self._left_open):",
        "        if stream is None:",
        "handed_back_by_nursery_start",
    ),
    (
        "pytest plugin: a process still in its exit reported as a leak",
        "pytest_plugin.py",
        "        leaked = _less_the_dying(listed, within=within) if listed else {}",
        "        leaked = dict(listed)",
        "still_dying_when_its_test_ends",
    ),
    (
        "spawn: an environment name holding '=' handed to env(1) as an assignment",
        "_through_sh.py",
        '        if any(b"=" in name for name in names):',
        "        if False:",
        "refused_alike",
    ),
    (
        "spawn: a NUL in the executable taken for a missing file",
        "_spawn.py",
        '    if "\\0" in os.fsdecode(program):\n        raise ValueError("embedded null byte")',
        '    if False:\n        raise ValueError("embedded null byte")',
        "refused_alike",
    ),
    (
        "cleanup log: a step a gone leader could not take said to go to the leader alone",
        "_core.py",
        '                logger.debug(\n                    "%s: the leader had exited: %s to every process instead",',
        '                (lambda *_: None)(\n                    "%s: the leader had exited: %s to every process instead",',
        "goes_to_the_whole_tree_once_the_leader_exited",
    ),
    (
        "run: --timeout 0 taken for a timeout at once, not for none",
        "_cli.py",
        "    return _seconds(text) or None",
        "    return _seconds(text)",
        "timeout_of_zero_means_no_timeout",
    ),
    (
        "close: a cancellation absorbed while the block's exception leaves it, never again",
        "asyncio.py",
        "        if cancelled is not None and isinstance(exc, Exception):",
        "        if False:",
        "ends_a_child_cancelled_while or cancelled_at_its_next_wait or exception_leaves_it_is_not",
    ),
    (
        "close: an absorbed cancellation delivered again at once, not at the next wait",
        "asyncio.py",
        "    task.get_loop().call_soon(again)",
        "    again()",
        "passes_on_its_way_out_leaves_no_stray",
    ),
    (
        "close: an anyio scope's cancellation delivered again by us, into a shielded scope",
        "asyncio.py",
        "        or (isinstance(message, str) and message.startswith(_ANYIO_SCOPES))",
        "        or False",
        "never_lands_in_a_shielded_scope",
    ),
    (
        "loops: the leader watched through a closed loop's future, never to be set",
        "asyncio.py",
        "            _still_open(self._exited.get_loop(), self)\n            self._exited = None",
        "            _still_open(self._exited.get_loop(), self)",
        "outliving_its_event_loop",
    ),
    (
        "loops: a cleanup stranded in a closed loop waited for through every cancellation",
        "asyncio.py",
        "            if began_in.is_closed():\n                # Its task",
        "            if False:\n                # Its task",
        "cut_off_by_its_loops_close_is_refused",
    ),
    (
        "cgroup: a kept cgroup someone put a process in given to the next tree",
        "_cgroup.py",
        '            if populated:\n                logger.warning("cgroup %s has a process',
        '            if False:\n                logger.warning("cgroup %s has a process',
        "kept_cgroup_someone_put_a_process_in",
    ),
    (
        "orphans: a subreaper by the image it exec'd from taken for none",
        "_orphans.py",
        "    if asked == 0 and flag.value:",
        "    if False:",
        "subreaper_that_execs_itself",
    ),
    (
        "cgroup: a tree cgroup removed by someone else taken for a failed read, not for empty",
        "_cgroup.py",
        "                raise\n            self._removed = True\n            return False",
        "                raise\n            raise",
        "removed_by_someone_else_is_taken_for_empty",
    ),
    (
        "watchdog: a write waiting for as long as the watchdog does not read",
        "_watchdog.py",
        "        ours.settimeout(SEND_WITHIN)\n",
        "",
        "stopped_reading_is_replaced",
    ),
    (
        "watchdog: one that stopped reading let go of alive, to wake and kill live trees",
        "_watchdog.py",
        "                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)",
        "                pass",
        "stopped_reading_is_replaced",
    ),
    (
        "watchdog: the exit waiting for a stopped watchdog for as long as it is stopped",
        "_watchdog.py",
        "            self._process.wait(timeout=STOP_WITHIN)",
        "            self._process.wait()",
        "waits_for_a_stopped_watchdog_only_so_long",
    ),
    (
        "spawn: a leader in a slow preexec_fn left to outlive a SIGKILLed parent",
        "_spawn.py",
        '        options["preexec_fn"] = _dying_with_us(options["preexec_fn"])',
        "        pass",
        "preexec_fn_takes_it_along",
    ),
    (
        "spawn: the parent-death signal of a preexec_fn kept past the exec (trio's trap)",
        "_spawn.py",
        "        if set_now.value == signal.SIGKILL:\n            prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)",
        "        if False:\n            prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)",
        "runs_with_no_parent_death_signal",
    ),
    (
        "close: a cancellation requested before the cleanup taken for one that came during it",
        "asyncio.py",
        "        if not task.done() and task.cancelling() > before:",
        "        if not task.done() and task.cancelling() > 0:",
        "requested_before_the_block_failed",
    ),
    (
        "close: anyio's scope cancellations before 4.11 ('by cancel scope') taken for plain",
        "asyncio.py",
        '_ANYIO_SCOPES = ("Cancelled via cancel scope ", "Cancelled by cancel scope ")',
        '_ANYIO_SCOPES = ("Cancelled via cancel scope ",)',
        "worded_as_anyios_before",
    ),
    (
        "loops: a pipe of a closed loop's transport closed through that loop",
        "asyncio.py",
        '    except RuntimeError:\n        pipe = transport.get_extra_info("pipe")',
        '    except ZeroDivisionError:\n        pipe = transport.get_extra_info("pipe")',
        "outliving_its_event_loop",
    ),
    (
        "loops: a closed loop's transport left to warn of itself as unclosed when collected",
        "asyncio.py",
        "            transport._pipe = None  # type: ignore[attr-defined]",
        "            pass",
        "outliving_its_event_loop",
    ),
    (
        "cgroup: a kept cgroup someone else removed failing the next tree's spawn",
        "_cgroup.py",
        "            except FileNotFoundError as exc:  # (removed by someone else)",
        "            except ZeroDivisionError as exc:  # (removed by someone else)",
        "someone_else_removed_is_passed_over",
    ),
    (
        "spawn: a parent-death signal the program's preexec_fn set cleared with ours",
        "_spawn.py",
        "        if set_now.value == signal.SIGKILL:",
        "        if True:",
        "programs_preexec_fn_set_is_kept",
    ),
    (
        "watchdog: a replacement kept with its first write cut short",
        "_watchdog.py",
        "                watchdog.abandon()\n                raise\n",
        "                pass\n",
        "cannot_take_every_registration",
    ),
    (
        "pytest plugin: a process that ended its exit since the listing reported as a leak",
        "pytest_plugin.py",
        "                    _reap_if_ours(fd)\n                os.close(fd)\n",
        "                    _reap_if_ours(fd)\n                os.close(fd)\n                running.add(pid)\n",
        "done_with_its_exit_before_the_check",
    ),
    (
        "pytest plugin: the second look's pidfd left open when the stat cannot be read",
        "pytest_plugin.py",
        "            except BaseException:  # out of file descriptors for the read, say\n"
        "                os.close(fd)\n",
        "            except BaseException:  # out of file descriptors for the read, say\n",
        "second_look_the_check_leaves_no_pidfd_open",
    ),
    (
        "pytest plugin: a process reaped before the second look reported as a leak",
        "pytest_plugin.py",
        "                continue  # ended since the listing, and reaped\n",
        "                running.add(pid)\n                continue\n",
        "reaped_before_the_check_looks_again",
    ),
    (
        "pytest plugin: a process whose main thread exited, running on, taken for ended",
        "pytest_plugin.py",
        "            if stat is None or stat.starttime != start or exited(fd):",
        "            if stat is None or stat.starttime != start or not stat.main_thread_alive:",
        "main_thread_exited_and_runs_on",
    ),
    (
        "cgroup: a kept cgroup that cannot be looked at (no descriptor left) dropped",
        "_cgroup.py",
        "                with self._lock:\n                    self._free.append(kept)\n                raise\n",
        "                continue\n",
        "cannot_be_looked_at_stays_kept",
    ),
    (
        "cgroup: a tree cgroup that cannot be made failing with mkdir's bare error",
        "_cgroup.py",
        "                raise CgroupUnavailable(_why_no_tree_cgroup(self.path, exc)) from exc",
        "                raise",
        "no_tree_cgroup_can_be_made",
    ),
    (
        "choose: auto failing a tree whose cgroup cannot be made, not taking the next",
        "_choose.py",
        "        if choice.otherwise is None:",
        "        if True:",
        "no_tree_cgroup_can_be_made",
    ),
    (
        "teardown: a hard stop that failed not told to the escalation",
        "_core.py",
        "                    emptied = False if hard_stop_failed else None\n",
        "                    emptied = None\n",
        "hard_stop_that_failed_is_named",
    ),
    (
        "teardown: a hard stop that failed reported as processes outliving SIGKILL",
        "_core.py",
        "        self.containment.kill()\n        except Exception as exc:  # noqa: BLE001 - even a bug here must not stop the escalation\n            errors.append(exc)\n            return False\n",
        "        self.containment.kill()\n        except Exception as exc:  # noqa: BLE001 - even a bug here must not stop the escalation\n            errors.append(exc)\n            return True\n",
        "hard_stop_that_failed_is_named",
    ),
    (
        "subreaper: a process in its exit (environment unreadable) taken for a stranger",
        "_subreaper.py",
        "    except (ProcessLookupError, PermissionError):\n",
        "    except (ProcessLookupError, PermissionError):\n        return False\n",
        "parent_is_still_exiting",
    ),
    (
        "pytest plugin: the descendants listed once, a daemon handed on meanwhile missed",
        "pytest_plugin.py",
        "_LISTINGS = 10\n",
        "_LISTINGS = 1\n",
        "handed_on_by_a_process_that_ended",
    ),
    (
        "watchdog: that it cannot start warned of for every tree",
        "_watchdog.py",
        "    level = logging.DEBUG if _unavailable_said else logging.WARNING\n",
        "    level = logging.WARNING\n",
        "cannot_start_is_warned_of_once",
    ),
    (
        "subreaper: the children of a process in its exit not looked at",
        "_subreaper.py",
        "        return roots + self._from_this_tree_below_their_exits()\n",
        "        return roots\n",
        "parent_is_still_exiting",
    ),
    (
        "run: a leader killed by a signal not a CalledProcessError when checked",
        "_run.py",
        "    if check and returncode != 0:",
        "    if check and returncode > 0:",
        "killed_by_a_signal_raises",
    ),
    (
        "run: input the command did not read reported as an error (trio)",
        "_trio.py",
        "        except (trio.BrokenResourceError, trio.ClosedResourceError):",
        "        except trio.ClosedResourceError:",
        "input_the_command_does_not_read",
    ),
    (
        "run: output held open past the drain bound said only at DEBUG (trio)",
        "_trio.py",
        '                logger.warning(\n                    "%s: output pipe still open',
        '                logger.debug(\n                    "%s: output pipe still open',
        "held_open_outside_the_group",
    ),
    (
        "run: output held open past the drain bound said only at DEBUG (asyncio)",
        "asyncio.py",
        '                    logger.warning(\n                        "%s: output pipe still op',
        '                    logger.debug(\n                        "%s: output pipe still op',
        "held_open_outside_the_group_is_read_for_a_bounded_time_with",
    ),
    (
        "wait: trio's ClosedResourceError let out when cleanup reaps the leader",
        "_trio.py",
        "                    pass  # cleanup reaped the leader while we waited",
        "                    raise  # cleanup reaped the leader while we waited",
        "gets_its_status_when_cleanup_reaps",
    ),
    (
        "wait: trio not told the leader's pidfd closes under a waiting task",
        "_trio.py",
        "        trio.lowlevel.notify_closing(fd)",
        "        pass",
        "gets_its_status_when_cleanup_reaps",
    ),
    (
        "teardown: a stream in place of stdin given the whole bound again at the end",
        "_core.py",
        "        left = started + self.policy.worst_case - time.monotonic()",
        "        left = self.policy.worst_case",
        "only_what_is_left_of_the_bound",
    ),
    (
        "group: a member that left the group during cleanup still counted",
        "_containment.py",
        "        if stat is not None and stat.pgid != self._pgid:",
        "        if False:",
        "leaves_the_group_during_cleanup",
    ),
    (
        "teardown: the cleanup errors after the first not logged",
        "_core.py",
        '                logger.error("%s: another cleanup error", self.label, exc_info=extra)',
        "                pass",
        "second_cleanup_error_is_logged",
    ),
    (
        "interrupt: a cleanup error raised in place of a Ctrl-C that came during cleanup",
        "_trio.py",
        "            if io.keyboard_interrupt is None:\n                raise\n",
        "            if True:\n                raise\n",
        "never_replaces_a_ctrl_c",
    ),
    (
        "group: the backstop of a tree not known to be empty dropped at its release",
        "_containment.py",
        "        if emptied and self.backstop:  # (none where the containment's own covers the tree)",
        "        if self.backstop:  # (none where the containment's own covers the tree)",
        "outlived_its_cleanup_dies",
    ),
    (
        "tracking: the backstop of a tree not known to be empty dropped at its release",
        "_containment.py",
        "        reap_orphans(self._leader.pid, self._ours, parent_thread=self._leader.parent_thread)\n        if emptied:\n",
        "        reap_orphans(self._leader.pid, self._ours, parent_thread=self._leader.parent_thread)\n        if True:\n",
        "outlived_its_cleanup_dies",
    ),
    (
        "run: the nursery's group left as the context of the exception it stood for",
        "_trio.py",
        "            single.__context__ = context\n",
        "            pass\n",
        "propagates_unwrapped",
    ),
    (
        "close: a cleanup error nobody waits for not logged (asyncio)",
        "asyncio.py",
        '            logger.error("%s: cleanup failed", self._core.label, exc_info=error)\n',
        "            pass\n",
        "cleanup_error_nobody_waits_for",
    ),
    (
        "pytest plugin: the dying waited for again at every listing",
        "pytest_plugin.py",
        "        within = max(deadline - time.monotonic(), 0.0)\n",
        "        within = _EXIT_WITHIN\n",
        "dying_once",
    ),
    (
        "teardown: a wait that could not look at the tree reported as one that saw it run",
        "_core.py",
        "                return Unseen() if self._look_failed else False\n",
        "                return False\n",
        "not_seen_gone",
    ),
    (
        "teardown: a tree not seen gone logged as still running after the stop signal",
        "_teardown.py",
        '    if isinstance(emptied, Unseen):\n        return f"not seen gone',
        '    if False:\n        return f"not seen gone',
        "not_seen_gone",
    ),
    (
        "cleanup: a cleanup error chained on with its links back to the exception kept",
        "_outcome.py",
        "        _cut_links_back_to(exc, error)\n",
        "        pass\n",
        "user_exception_wins_and_carries or hard_stop_that_failed",
    ),
    (
        "close: a deadline that passed during the cleanup not raised after it (trio)",
        "_trio.py",
        "        if await self._run_cleanup():\n            await trio.lowlevel.checkpoint_if_cancelled()\n",
        "        if await self._run_cleanup():\n            pass\n",
        "deadline_that_passes_during_cleanup",
    ),
    (
        "close: the block's normal end not checked for a deadline passed in its cleanup",
        "_trio.py",
        "        if exc is None:\n            await self._tree._cleanup_then_cancellation()",
        "        if exc is None:\n            await self._tree._run_cleanup()",
        "deadline_that_passes_during_cleanup",
    ),
    (
        "close: a cleanup error carried on the Cancelled of a deadline passing in it (trio)",
        "_trio.py",
        "        if await self._run_cleanup():\n            await trio.lowlevel.checkpoint_if_cancelled()\n",
        "        try:\n"
        "            scheduled = await self._run_cleanup()\n"
        "        except Exception as error:\n"
        "            try:\n"
        "                await trio.lowlevel.checkpoint_if_cancelled()\n"
        "            except trio.Cancelled as cancelled:\n"
        "                chain_cleanup_error(cancelled, error, self._core.label)\n"
        "                raise cancelled from None\n"
        "            raise\n"
        "        if scheduled:\n"
        "            await trio.lowlevel.checkpoint_if_cancelled()\n",
        "raised_though_a_deadline",
    ),
    (
        "close: aclose not marked as a coroutine function for those who inspect it (asyncio)",
        "asyncio.py",
        "    aclose = _inspected_as_async(aclose)\n",
        "\n",
        "recognised_as_async",
    ),
    (
        "clock: cleanup's waits bounded on a mock clock's time, not in real seconds",
        "_trio.py",
        "        self._virtual = clock_is_virtual()\n",
        "        self._virtual = False\n",
        "autojump_clock or still_clock",
    ),
    (
        "clock: cleanup's deadlines counted on a mock clock's time, not in real seconds",
        "_real_time.py",
        "    return time.monotonic() if virtual else trio.current_time()\n",
        "    return trio.current_time()\n",
        "still_clock",
    ),
    (
        "clock: the output drain bounded on a mock clock's time, not in real seconds",
        "_trio.py",
        "            with bound(PIPE_DRAIN_TIMEOUT, virtual=clock_is_virtual()) as drain:\n",
        "            with bound(PIPE_DRAIN_TIMEOUT, virtual=False) as drain:\n",
        "held_outside_the_tree_is_read_for_real_seconds",
    ),
    (
        "clock: cleanup's waits in real seconds not shielded from the caller's cancellation",
        "_real_time.py",
        "        self._scope = trio.CancelScope(shield=shield)\n",
        "        self._scope = trio.CancelScope()\n",
        "cut_cleanup_short_under_an_autojump_clock",
    ),
    (
        "trio: a cleanup that never waited no schedule point (aclose, the block's end)",
        "_trio.py",
        "            await trio.lowlevel.checkpoint()\n",
        "            await trio.lowlevel.checkpoint_if_cancelled()\n",
        "checkpoints_for_a_tree_that_ended",
    ),
]


def run(name: str, path: str, old: str, new: str, tests: str) -> bool:
    """Apply one mutant to a copy of the package; True if the tests went red."""
    with tempfile.TemporaryDirectory() as scratch:
        for part in ("trio_proctree", "tests"):
            shutil.copytree(ROOT / part, Path(scratch) / part)
        shutil.copy(ROOT / "pyproject.toml", scratch)
        target = Path(scratch) / "trio_proctree" / path
        source = target.read_text()
        if old not in source:
            raise SystemExit(f"{name}: the original text is no longer in {path}; update the mutant")
        target.write_text(source.replace(old, new, 1))
        # Run in the copy: the current directory goes first on sys.path, so the mutated
        # package shadows the installed (editable) one; PYTHONPATH does the same for the
        # Python processes the tests start (a pytest run of the plugin's, say).
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [scratch, os.environ.get("PYTHONPATH")])),
        }
        python = [sys.executable]
        if name.endswith("[glibc]"):
            # Mutants of the direct start, which only glibc 2.41+ takes.
            library = next(GLIBC.glob("usr/lib/*/libc.so.6"), None)
            if library is None:
                raise SystemExit(f"{name}: needs Debian 13's glibc: run nox -s tests_glibc")
            loader = next(GLIBC.glob("usr/lib*/ld-linux*.so.*"))
            python = [str(loader), "--library-path", str(library.parent), sys.executable]
        result = subprocess.run(
            [*python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
             "-o", "check_process_leaks=false", "-k", tests, "tests"],
            cwd=scratch, env=env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if result.returncode == 5:
            raise SystemExit(f"{name}: no test matched -k {tests!r}")
        return result.returncode != 0


def main(prefixes: list[str]) -> int:
    survivors = []
    chosen = [m for m in MUTANTS if not prefixes or any(m[0].startswith(p) for p in prefixes)]
    for mutant in chosen:
        red = run(*mutant)
        print(f"{'killed  ' if red else 'SURVIVED'}  {mutant[0]}", flush=True)
        if not red:
            survivors.append(mutant[0])
    print(f"{len(chosen) - len(survivors)}/{len(chosen)} named mutants killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
