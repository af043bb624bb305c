"""What an emulated run of another CPU architecture's image needs from the host, beyond qemu-user-static. Pure.

torch's aarch64 build reads the CPU's identification register from sysfs when it loads (oneDNN's xbyak_aarch64:
``/sys/devices/system/cpu/cpu0/regs/identification/midr_el1``); an x86_64 host has no such file, and torch then
crashes on import under qemu ("Can't open MIDR_EL1 sysfs entry", SIGSEGV). The emulated self-test mounts a CPU folder
that describes the host's CPUs as Grace's cores (Arm Neoverse V2: implementer 0x41, part 0xD4F; Linux
arch/arm64/include/asm/cputype.h, ARM_CPU_PART_NEOVERSE_V2), which is what a linux/arm64 image meets on a GH200 or
GB200 host. It is read-only and exists for that one container; the image is not changed.
"""

from __future__ import annotations

MIDR_NEOVERSE_V2 = "0x00000000410fd4f0"  # implementer 0x41 (Arm), architecture 0xf, part 0xd4f, r0p0


def arm64_cpu_folder(cpus: int) -> dict[str, str]:
    """The files of /sys/devices/system/cpu for ``cpus`` emulated arm64 CPUs: what the lists and each CPU's
    identification registers say."""
    cpus = max(1, cpus)
    span = "0" if cpus == 1 else f"0-{cpus - 1}"
    files = {"online": span, "possible": span, "present": span, "offline": "", "kernel_max": str(max(cpus - 1, 0))}
    for n in range(cpus):
        files[f"cpu{n}/regs/identification/midr_el1"] = MIDR_NEOVERSE_V2
        files[f"cpu{n}/regs/identification/revidr_el1"] = "0x0000000000000000"
    return {path: text + "\n" for path, text in files.items()}
