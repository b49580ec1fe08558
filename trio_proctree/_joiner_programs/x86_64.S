# The joiner for x86-64 (trio_proctree/_joiner.py): a leader's first program where the
# C library cannot start a process in its cgroup (glibc before 2.41). It writes itself
# into the tree's cgroup, then execs the command as subprocess.Popen's child would: the
# environment, argv[0] and every option Popen applied before this exec are the command's,
# untouched.
#
#   join-x86_64 PROCS CANDIDATE... "" ARGV0 ARG...
#
# PROCS: the cgroup's cgroup.procs (written "0": the writer itself). CANDIDATEs: the paths
# to exec, in the order Popen's child tries them (the first that execs wins); an empty
# argument ends them. Exit status 125 and a message if the cgroup cannot be joined; 127
# if no candidate was there, 126 if one was but none could be run (sh's statuses).
#
# No C library, no loader: one exec of a few hundred bytes (a /bin/sh in its place cost
# ~0.2 ms of CPU a spawn). Built by tests/test_joiner.py's commands (as, ld, strip),
# which also check that the committed file is this source's.

        .intel_syntax noprefix
        .globl  _start
        .text
_start:
        mov     rbx, rsp                # [rbx]: argc, [rbx+8]: argv[0], ...
        cmp     qword ptr [rbx], 3      # the least: our name, PROCS, ""
        jb      usage
        mov     rdi, [rbx+16]           # open(PROCS, O_WRONLY | O_CLOEXEC)
        mov     esi, 0x80001
        mov     eax, 2
        syscall
        test    rax, rax
        js      cannot_join
        mov     rbp, rax
        mov     rdi, rax                # write(fd, "0", 1)
        lea     rsi, [rip + zero]
        mov     edx, 1
        mov     eax, 1
        syscall
        mov     r12, rax
        mov     rdi, rbp                # close(fd): with stderr closed, the descriptor
        mov     eax, 3                  # is 2, where a message would go into the
        syscall                         # cgroup.procs (helper-107)
        cmp     r12, 1
        jne     cannot_join
        lea     r12, [rbx+24]           # r12: the next candidate
        mov     r13, r12                # r13: the empty argument that ends them
find_end:
        mov     rax, [r13]
        test    rax, rax
        jz      usage                   # (none: not our caller)
        cmp     byte ptr [rax], 0
        je      found_end
        add     r13, 8
        jmp     find_end
found_end:
        lea     r14, [r13+8]            # r14: the command's argv
        cmp     qword ptr [r14], 0
        je      usage
        mov     rcx, [rbx]
        lea     r15, [rbx+rcx*8+16]     # r15: the environment, as we got it
        xor     ebp, ebp                # ebp: the first error other than "not there"
try_next:
        cmp     r12, r13
        je      none_ran
        mov     rdi, [r12]              # execve(candidate, argv, envp): returns only
        mov     rsi, r14                # if it failed
        mov     rdx, r15
        mov     eax, 59
        syscall
        add     r12, 8
        neg     eax
        cmp     eax, 2                  # ENOENT
        je      try_next
        cmp     eax, 20                 # ENOTDIR
        je      try_next
        test    ebp, ebp
        jnz     try_next
        mov     ebp, eax
        jmp     try_next
none_ran:
        lea     rsi, [rip + cannot_run]
        mov     edx, OFFSET cannot_run_len
        mov     rdi, [r14]
        call    say
        mov     edi, 127
        test    ebp, ebp
        jz      leave
        mov     edi, 126
        jmp     leave
cannot_join:
        lea     rsi, [rip + cannot_join_msg]
        mov     edx, OFFSET cannot_join_len
        mov     rdi, [rbx+16]
        call    say
        mov     edi, 125
        jmp     leave
usage:
        mov     edi, 2
leave:
        mov     eax, 231                # exit_group
        syscall

# say: write the message at rsi (rdx bytes), then the string at rdi, then a newline, to
# stderr; errors ignored (stderr may be closed).
say:
        push    rdi
        mov     edi, 2
        mov     eax, 1
        syscall
        pop     rsi
        xor     edx, edx
strlen:
        cmp     byte ptr [rsi+rdx], 0
        je      strlen_done
        inc     rdx
        jmp     strlen
strlen_done:
        mov     edi, 2
        mov     eax, 1
        syscall
        mov     edi, 2
        lea     rsi, [rip + newline]
        mov     edx, 1
        mov     eax, 1
        syscall
        ret

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
