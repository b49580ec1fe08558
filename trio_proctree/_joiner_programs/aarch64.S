// The joiner for 64-bit Arm (trio_proctree/_joiner.py), the x86-64 one's twin
// (x86_64.S says what it is for): it writes itself into the tree's cgroup, then execs
// the command as subprocess.Popen's child would, the environment, argv[0] and every
// option Popen applied before this exec untouched.
//
//   join-aarch64 PROCS CANDIDATE... "" ARGV0 ARG...
//
// PROCS: the cgroup's cgroup.procs (written "0": the writer itself). CANDIDATEs: the paths
// to exec, in the order Popen's child tries them (the first that execs wins); an empty
// argument ends them. Exit status 125 and a message if the cgroup cannot be joined; 127
// if no candidate was there, 126 if one was but none could be run (sh's statuses).
//
// No C library, no loader. Built by tests/test_joiner.py's commands (as, ld, strip, with
// the aarch64-linux-gnu- prefix off Arm), which also check that the committed file is
// this source's, and run it under qemu-aarch64 where that is installed (nox -s joiners).

        .text
// The messages first, so that their lengths are known where they are used.
zero:
        .ascii  "0"
newline:
        .ascii  "\n"
cannot_join_msg:
        .ascii  "trio_proctree: cannot join the cgroup of "
        .set    cannot_join_len, . - cannot_join_msg
cannot_run:
        .ascii  "trio_proctree: cannot run "
        .set    cannot_run_len, . - cannot_run

        .balign 4
        .globl  _start
_start:
        mov     x19, sp                 // [x19]: argc, [x19, 8]: argv[0], ...
        ldr     x0, [x19]
        cmp     x0, #3                  // the least: our name, PROCS, ""
        b.lo    usage
        mov     x0, #-100               // openat(AT_FDCWD, PROCS, O_WRONLY | O_CLOEXEC)
        ldr     x1, [x19, #16]
        movz    x2, #0x8, lsl #16
        movk    x2, #0x1
        mov     x3, #0
        mov     x8, #56
        svc     #0
        tbnz    x0, #63, cannot_join
        mov     x20, x0
        adr     x1, zero                // write(fd, "0", 1)
        mov     x2, #1
        mov     x8, #64
        svc     #0
        mov     x21, x0
        mov     x0, x20                 // close(fd): with stderr closed, the descriptor
        mov     x8, #57                 // is 2, where a message would go into the
        svc     #0                      // cgroup.procs (helper-107)
        cmp     x21, #1
        b.ne    cannot_join
        add     x22, x19, #24           // x22: the next candidate
        mov     x23, x22                // x23: the empty argument that ends them
find_end:
        ldr     x0, [x23]
        cbz     x0, usage               // (none: not our caller)
        ldrb    w1, [x0]
        cbz     w1, found_end
        add     x23, x23, #8
        b       find_end
found_end:
        add     x24, x23, #8            // x24: the command's argv
        ldr     x0, [x24]
        cbz     x0, usage
        ldr     x1, [x19]
        add     x25, x19, x1, lsl #3
        add     x25, x25, #16           // x25: the environment, as we got it
        mov     w26, #0                 // w26: the first error other than "not there"
try_next:
        cmp     x22, x23
        b.eq    none_ran
        ldr     x0, [x22]               // execve(candidate, argv, envp): returns only
        mov     x1, x24                 // if it failed
        mov     x2, x25
        mov     x8, #221
        svc     #0
        add     x22, x22, #8
        neg     w0, w0
        cmp     w0, #2                  // ENOENT
        b.eq    try_next
        cmp     w0, #20                 // ENOTDIR
        b.eq    try_next
        cbnz    w26, try_next
        mov     w26, w0
        b       try_next
none_ran:
        adr     x1, cannot_run
        mov     x2, #cannot_run_len
        ldr     x3, [x24]
        bl      say
        mov     x0, #127
        cbz     w26, leave
        mov     x0, #126
        b       leave
cannot_join:
        adr     x1, cannot_join_msg
        mov     x2, #cannot_join_len
        ldr     x3, [x19, #16]
        bl      say
        mov     x0, #125
        b       leave
usage:
        mov     x0, #2
leave:
        mov     x8, #94                 // exit_group
        svc     #0

// say: write the message at x1 (x2 bytes), then the string at x3, then a newline, to
// stderr; errors ignored (stderr may be closed). A system call changes x0 alone.
say:
        mov     x0, #2
        mov     x8, #64
        svc     #0
        mov     x1, x3
        mov     x2, #0
strlen:
        ldrb    w4, [x1, x2]
        cbz     w4, strlen_done
        add     x2, x2, #1
        b       strlen
strlen_done:
        mov     x0, #2
        mov     x8, #64
        svc     #0
        mov     x0, #2
        adr     x1, newline
        mov     x2, #1
        mov     x8, #64
        svc     #0
        ret
