"""Run-time trace of the launches (which kernels a case really launched)."""
from __future__ import annotations


class LaunchTrace:
    """Wraps the one launch path (custom_kernels.launch.LaunchShape) to record (source file, kernel
    name) of every launch. Best effort: a missing hook only disables the check."""

    def __init__(self):
        self.current: list[tuple[str, str]] = []
        self.all: set[tuple[str, str]] = set()
        self.active = False

    def _record(self, module_name: str, kernel_name: str) -> None:
        key = (str(module_name).split("@")[0], kernel_name)
        self.current.append(key)
        self.all.add(key)

    def install(self) -> None:
        trace = self
        try:
            from custom_kernels.launch import LaunchShape

            init, launch = LaunchShape.__init__, LaunchShape.launch
            if not getattr(launch, "_sanitize_wrapped", False):
                def init_w(self, kernel, *a, **kw):
                    init(self, kernel, *a, **kw)
                    self._sanitize_module = getattr(getattr(kernel, "module", None), "name", "?")

                def launch_w(self, *a, **kw):
                    trace._record(getattr(self, "_sanitize_module", "?"), self.name)
                    return launch(self, *a, **kw)
                launch_w._sanitize_wrapped = True
                LaunchShape.__init__, LaunchShape.launch = init_w, launch_w
            self.active = True
        except Exception as exc:  # noqa: BLE001
            print(f"note: launch trace off ({exc})")

    def take(self) -> list[tuple[str, str]]:
        out, self.current = self.current, []
        return out
