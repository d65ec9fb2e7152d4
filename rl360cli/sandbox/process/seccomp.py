"""A seccomp filter that refuses ptrace to process sandboxes: bubblewrap installs it before the command runs.

A process sandbox's commands all run as one uid, and with no Yama LSM (as on this machine) a process
may trace any other of its uid: the agent could attach to the verifier's python, or to a sibling of its
own command, and rewrite what it computes. The filter answers `ptrace`, `process_vm_readv` and
`process_vm_writev` with EPERM and lets every other system call through (the rest is left to the
namespaces, the read-only root and the rlimits). It is classic BPF, built here, so nothing needs
libseccomp; `bwrap --seccomp FD` reads it from a pipe. A sandbox with a keeper (process/keeper.py) gets
`deny_ptrace_and_sigcont_program`, which also refuses sending SIGCONT.

Test: tests/sandbox/test_security.py (a sandbox's PTRACE_ATTACH of its own sibling is refused),
tests/sandbox/test_process_keeper.py (and SIGCONT, under a keeper).
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; __u32 arch; ...
_NR, _ARCH = 0, 4
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15     # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35     # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06     # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_DENY = 0x00050000 | errno.EPERM  # SECCOMP_RET_ERRNO
_X32_BIT = 0x40000000

# (audit arch, [ptrace, process_vm_readv, process_vm_writev], also refuse the x32 ABI) per native and
# compat ABI of each machine; an i386 or 32-bit arm binary calls through its own numbers.
_ABIS = {
    "x86_64": [(0xC000003E, (101, 310, 311), True), (0x40000003, (26, 347, 348), False)],
    "aarch64": [(0xC00000B7, (117, 270, 271), False), (0x40000028, (26, 376, 377), False)],
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return code, jt, jf, k


def deny_ptrace_program(machine: str | None = None) -> bytes | None:
    """The filter as `struct sock_filter[]` bytes for this machine, or None where its numbers are not known."""
    abis = _ABIS.get(machine or platform.machine())
    if abis is None:
        return None
    blocks = []
    for arch, numbers, refuse_x32 in abis:
        # ld arch; jeq arch ? next : skip the block; ld nr; [jge x32 -> deny]; jeq n -> deny ...; ret allow
        body = [("ld", _NR)] + ([("jge", _X32_BIT)] if refuse_x32 else []) + [("jeq", n) for n in numbers]
        blocks.append((arch, body))
    total = sum(3 + len(body) for _, body in blocks) + 1  # each block: ld arch, jeq, body, ret; one default ret
    program: list[tuple[int, int, int, int]] = []
    deny_at = total  # index of the final `ret deny` (after the default `ret allow`)
    for arch, body in blocks:
        program.append(_op(_LD_W_ABS, _ARCH))
        program.append(_op(_JEQ_K, arch, 0, len(body) + 1))  # past the body and its `ret allow`
        for kind, k in body:
            here = len(program)
            if kind == "ld":
                program.append(_op(_LD_W_ABS, k))
            else:
                program.append(_op(_JGE_K if kind == "jge" else _JEQ_K, k, deny_at - here - 1, 0))
        program.append(_op(_RET_K, _ALLOW))
    program.append(_op(_RET_K, _ALLOW))  # an ABI not listed: nothing to refuse
    assert len(program) == deny_at, (len(program), deny_at)
    program.append(_op(_RET_K, _DENY))
    return b"".join(struct.pack("HBBI", *op) for op in program)


# The system calls that send a signal, per audit arch: (number, index of the signal argument) for kill, tkill,
# tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_send_signal.
_SIGNALLERS = {
    0xC000003E: ((62, 1), (200, 1), (234, 2), (129, 1), (297, 2), (424, 1)),  # x86_64
    0x40000003: ((37, 1), (238, 1), (270, 2), (178, 1), (335, 2), (424, 1)),  # i386
    0xC00000B7: ((129, 1), (130, 1), (131, 2), (138, 1), (240, 2), (424, 1)),  # aarch64
    0x40000028: ((37, 1), (238, 1), (268, 2), (178, 1), (363, 2), (424, 1)),  # arm
}
_SIGCONT = 18  # the same number on x86 and arm
_ARGS = 16  # offset of args[0] in struct seccomp_data (u64 each; the low half first on these little-endian machines)


def deny_ptrace_and_sigcont_program(machine: str | None = None) -> bytes | None:
    """`deny_ptrace_program`'s filter that also refuses sending SIGCONT (EPERM), for a sandbox whose processes
    live between commands (process/keeper.py): rl360 stops them all while it works on the sandbox's files
    from the host, and none of them may wake another meanwhile; only the host continues them."""
    abis = _ABIS.get(machine or platform.machine())
    if abis is None:
        return None
    # Assembled with labels: ("op", code, k, true-label or None, false-label or None), ("label", name).
    code: list[tuple] = []
    for i, (arch, numbers, refuse_x32) in enumerate(abis):
        after = f"arch{i + 1}"
        code += [("op", _LD_W_ABS, _ARCH, None, None), ("op", _JEQ_K, arch, None, after),
                 ("op", _LD_W_ABS, _NR, None, None)]
        if refuse_x32:
            code.append(("op", _JGE_K, _X32_BIT, "deny", None))
        code += [("op", _JEQ_K, n, "deny", None) for n in numbers]
        for j, (number, arg) in enumerate(_SIGNALLERS.get(arch, ())):
            skip = f"sig{i}.{j}"
            code += [("op", _JEQ_K, number, None, skip), ("op", _LD_W_ABS, _ARGS + 8 * arg, None, None),
                     ("op", _JEQ_K, _SIGCONT, "deny", "allow"), ("label", skip)]
        code += [("op", _RET_K, _ALLOW, None, None), ("label", after)]
    code += [("label", "allow"), ("op", _RET_K, _ALLOW, None, None),
             ("label", "deny"), ("op", _RET_K, _DENY, None, None)]
    where: dict[str, int] = {}
    ops = []
    for item in code:
        if item[0] == "label":
            where[item[1]] = len(ops)
        else:
            ops.append(item[1:])
    program = []
    for here, (op, k, true, false) in enumerate(ops):
        jt = where[true] - here - 1 if true else 0
        jf = where[false] - here - 1 if false else 0
        assert 0 <= jt < 256 and 0 <= jf < 256, (here, jt, jf)
        program.append(_op(op, k, jt, jf))
    return b"".join(struct.pack("HBBI", *op) for op in program)
