//! Which device a run uses: `--device auto|cpu|cuda[:N]|cuda-emulated`.
//!
//! `auto` (the default) takes GPU 0 when one is usable (driver, device, cuBLASLt and
//! NVRTC all present) and otherwise the CPU, saying why; an explicit `cuda` without a
//! usable GPU is an error naming what is missing. A binary built without the `cuda`
//! feature says so. `cuda-emulated` is the CUDA backend with its kernels built for the
//! CPU by a C++ compiler (`Cuda::emulated`): slow, for checking the backend and a new
//! kernel without a GPU.

use std::fmt;
use std::str::FromStr;

use crate::cpu::Cpu;
use crate::device::ExecError;

/// A device request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A usable GPU, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// GPU `ordinal`.
    Cuda(usize),
    /// The CUDA backend on the CPU, its kernels emulated.
    CudaEmulated,
}

impl FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<DeviceSpec, String> {
        let bad = || format!("device '{s}': use auto, cpu, cuda, cuda:N (N the GPU index, e.g. cuda:0) or cuda-emulated");
        match s.trim() {
            "auto" => Ok(DeviceSpec::Auto),
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda-emulated" => Ok(DeviceSpec::CudaEmulated),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(0)),
            t => match t.strip_prefix("cuda:") {
                Some(n) => n.parse().map(DeviceSpec::Cuda).map_err(|_| bad()),
                None => Err(bad()),
            },
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Auto => write!(f, "auto"),
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceSpec::CudaEmulated => write!(f, "cuda-emulated"),
        }
    }
}

/// The device a run got.
pub enum Chosen {
    /// The CPU, with the reason when a GPU was asked for by `auto` but is not usable.
    Cpu(Cpu, Option<String>),
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::Cuda),
}

impl Chosen {
    /// The device's name.
    pub fn name(&self) -> String {
        use crate::device::Device;
        match self {
            Chosen::Cpu(c, _) => c.name(),
            #[cfg(feature = "cuda")]
            Chosen::Cuda(c) => c.name(),
        }
    }
}

/// Why CUDA is not usable here, or `None` when GPU `ordinal` is.
pub fn cuda_unusable(ordinal: usize) -> Option<String> {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::probe(ordinal).err().map(|e| e.to_string())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Some(BUILT_WITHOUT.into())
    }
}

#[cfg(not(feature = "cuda"))]
const BUILT_WITHOUT: &str = "this runner was built without CUDA support (rebuild with the \
                             default features of runner-exec, e.g. `cuda-13000`)";

/// Open the device `spec` asks for.
///
/// # Errors
/// An explicit `cuda` request that cannot be met: [`ExecError::NoCuda`] naming the missing
/// driver, library or device.
pub fn choose(spec: DeviceSpec) -> Result<Chosen, ExecError> {
    match spec {
        DeviceSpec::Cpu => Ok(Chosen::Cpu(Cpu::new(), None)),
        DeviceSpec::Auto => match open_cuda(0) {
            Ok(c) => Ok(c),
            Err(e) => Ok(Chosen::Cpu(Cpu::new(), Some(format!("no usable GPU ({e}); using the CPU")))),
        },
        DeviceSpec::Cuda(n) => open_cuda(n).map_err(|e| match e {
            ExecError::NoCuda(why) => ExecError::NoCuda(format!("--device cuda:{n}: {why}")),
            other => other,
        }),
        DeviceSpec::CudaEmulated => open_emulated().map_err(|e| match e {
            ExecError::NoCuda(why) => ExecError::NoCuda(format!("--device cuda-emulated: {why}")),
            other => other,
        }),
    }
}

/// [`choose`] for a command that times the device (`what` names it): the emulated
/// device is refused, since it computes what a GPU would but not at a GPU's speed.
///
/// # Errors
/// As [`choose`]; [`ExecError::NoCuda`] for `--device cuda-emulated`.
pub fn choose_timed(spec: DeviceSpec, what: &str) -> Result<Chosen, ExecError> {
    if spec == DeviceSpec::CudaEmulated {
        return Err(ExecError::NoCuda(format!(
            "--device cuda-emulated computes what a GPU would, not how fast: {what} times the device, so it needs a GPU \
             (--device cuda) or the CPU (--device cpu); the emulated device is for `bench kernels` and `train`"
        )));
    }
    choose(spec)
}

fn open_emulated() -> Result<Chosen, ExecError> {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::Cuda::emulated().map(Chosen::Cuda)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(ExecError::NoCuda(BUILT_WITHOUT.into()))
    }
}

fn open_cuda(ordinal: usize) -> Result<Chosen, ExecError> {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::Cuda::new(ordinal).map(Chosen::Cuda)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(ExecError::NoCuda(BUILT_WITHOUT.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_the_forms() {
        assert_eq!("auto".parse(), Ok(DeviceSpec::Auto));
        assert_eq!("cpu".parse(), Ok(DeviceSpec::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceSpec::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceSpec::Cuda(3)));
        assert_eq!("cuda-emulated".parse(), Ok(DeviceSpec::CudaEmulated));
        assert_eq!(DeviceSpec::CudaEmulated.to_string().parse(), Ok(DeviceSpec::CudaEmulated));
        let e = "cuda:x".parse::<DeviceSpec>().unwrap_err();
        assert!(e.contains("cuda:N"), "{e}");
        assert!("tpu".parse::<DeviceSpec>().is_err());
        assert_eq!(DeviceSpec::Cuda(2).to_string(), "cuda:2");
        // Aliases and surrounding blanks.
        assert_eq!("gpu".parse(), Ok(DeviceSpec::Cuda(0)));
        assert_eq!(" cpu\n".parse(), Ok(DeviceSpec::Cpu));
    }

    /// `--device cpu` is the CPU with no note; a timed command refuses the emulated
    /// device (it computes what a GPU would, not how fast), before trying to open it.
    #[test]
    fn cpu_has_no_note_and_timed_commands_refuse_the_emulated_device() {
        assert!(matches!(choose(DeviceSpec::Cpu), Ok(Chosen::Cpu(_, None))));
        assert!(matches!(choose_timed(DeviceSpec::Cpu, "bench"), Ok(Chosen::Cpu(_, None))));
        let e = choose_timed(DeviceSpec::CudaEmulated, "bench").err().expect("refused").to_string();
        assert!(e.contains("cuda-emulated computes what a GPU would") && e.contains("bench times the device"), "{e}");
    }

    /// On a machine without a GPU (CI, the development machines) `auto` falls back to
    /// the CPU saying why, and an explicit `cuda` is an error naming what is missing,
    /// never a panic. On a machine with a usable GPU both open it.
    #[test]
    fn without_a_gpu_auto_says_so_and_cuda_names_what_is_missing() {
        match cuda_unusable(0) {
            Some(why) => {
                match choose(DeviceSpec::Auto).unwrap() {
                    Chosen::Cpu(_, Some(note)) => assert!(note.contains("using the CPU"), "{note}"),
                    _ => panic!("auto picked a device although CUDA is unusable: {why}"),
                }
                let e = choose(DeviceSpec::Cuda(0)).err().expect("cuda without a GPU").to_string();
                assert!(e.starts_with("--device cuda:0: "), "{e}");
                assert!(
                    ["driver", "built without", "no CUDA device", "not on the loader path", "did not initialise"]
                        .iter()
                        .any(|w| e.contains(w)),
                    "names what is missing: {e}"
                );
            }
            None => assert!(matches!(choose(DeviceSpec::Auto), Ok(c) if !c.name().starts_with("cpu"))),
        }
    }

    /// Every request prints as the form that parses back to it (the run records and
    /// messages show `--device` this way), and an empty request is refused, not read as
    /// `auto` (an unset variable in a script).
    #[test]
    fn every_spec_prints_as_what_parses_back_to_it_and_empty_is_refused() {
        for spec in [DeviceSpec::Auto, DeviceSpec::Cpu, DeviceSpec::Cuda(0), DeviceSpec::Cuda(7), DeviceSpec::CudaEmulated] {
            assert_eq!(spec.to_string().parse(), Ok(spec), "{spec}");
        }
        assert_eq!((DeviceSpec::Auto.to_string(), DeviceSpec::Cpu.to_string()), ("auto".to_string(), "cpu".to_string()));
        for bad in ["", "  ", "cuda:", "cuda:-1", "cuda:1.5", "cuda0"] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(e.contains("use auto, cpu, cuda, cuda:N"), "{bad:?}: {e}");
        }
    }

    /// Only the emulated device is refused by a timed command: `auto` is taken as asked
    /// (the CPU with its note where no GPU is usable), and a GPU that cannot be had is
    /// named by its index in the error (here cuda:99, which no machine has).
    #[test]
    fn timed_commands_take_auto_and_a_missing_gpu_is_named_by_its_index() {
        match choose_timed(DeviceSpec::Auto, "bench") {
            Ok(Chosen::Cpu(_, note)) => assert_eq!(note.is_some(), cuda_unusable(0).is_some(), "{note:?}"),
            Ok(c) => assert!(cuda_unusable(0).is_none(), "{}", c.name()),
            Err(e) => panic!("auto refused by a timed command: {e}"),
        }
        let e = choose(DeviceSpec::Cuda(99)).err().expect("no machine has a GPU 99").to_string();
        assert!(e.starts_with("--device cuda:99: "), "{e}");
        if cuda_unusable(0).is_none() {
            assert!(e.contains("cuda:99 asked for"), "{e}");
        }
    }
}
