//! Synthetic workflow traces, deterministic from a seed: for sample traces, simulator speed
//! measurements and tests, when no recorded trace of the right size is at hand.
//!
//! The shape follows the SWarp pipeline of the DataWarp paper: each pipeline (one rank) imports a
//! shared software environment (many small stats, opens and reads), resamples its input images
//! (drawn from a shared pool, so pipelines overlap and inputs are reused), writes one intermediate
//! per input, reads the intermediates back to co-add them, writes one output and unlinks the
//! intermediates. Every trace produced here is marked synthesized.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use spillway_trace::{JobMeta, Op, Trace, TraceOp};

/// Parameters of a synthetic workflow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkflowShape {
    pub pipelines: u32,
    pub inputs_per_pipeline: u32,
    /// Distinct input images shared by all pipelines (smaller pool → more reuse).
    pub input_pool: u32,
    pub input_bytes: u64,
    pub transfer_bytes: u64,
    /// How many times the co-add stage reads each intermediate.
    pub reread_passes: u32,
    /// Small software-environment files each pipeline imports.
    pub software_files: u32,
    pub seed: u64,
}

impl Default for WorkflowShape {
    fn default() -> Self {
        WorkflowShape {
            pipelines: 8,
            inputs_per_pipeline: 16,
            input_pool: 64,
            input_bytes: 32 << 20,
            transfer_bytes: 4 << 20,
            reread_passes: 2,
            software_files: 200,
            seed: 1,
        }
    }
}

/// Why a shape cannot be generated.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum SynthError {
    #[error("{field} must be at least 1")]
    Zero { field: &'static str },
    #[error("the shape would generate about {ops} operations, more than the limit of {limit}")]
    TooLarge { ops: u64, limit: u64 },
}

/// Largest synthetic trace, in operations (about 50 bytes of memory each).
pub const SYNTH_OPS_MAX: u64 = 100_000_000;

impl WorkflowShape {
    /// Approximate operation count, to bound memory before generating.
    pub fn estimated_ops(&self) -> u64 {
        let transfers = self.input_bytes.div_ceil(self.transfer_bytes.max(1));
        let per_input = transfers * (2 + u64::from(self.reread_passes)) + 8;
        let per_pipeline = u64::from(self.inputs_per_pipeline) * per_input
            + u64::from(self.software_files) * 4
            + transfers
            + 4;
        u64::from(self.pipelines) * per_pipeline
    }

    fn validate(&self) -> Result<(), SynthError> {
        for (field, value) in [
            ("pipelines", u64::from(self.pipelines)),
            ("inputs_per_pipeline", u64::from(self.inputs_per_pipeline)),
            ("input_pool", u64::from(self.input_pool)),
            ("input_bytes", self.input_bytes),
            ("transfer_bytes", self.transfer_bytes),
        ] {
            if value == 0 {
                return Err(SynthError::Zero { field });
            }
        }
        let ops = self.estimated_ops();
        if ops > SYNTH_OPS_MAX {
            return Err(SynthError::TooLarge { ops, limit: SYNTH_OPS_MAX });
        }
        Ok(())
    }
}

struct Builder {
    files: Vec<String>,
    ids: HashMap<String, u32>,
    ops: Vec<TraceOp>,
}

impl Builder {
    fn file(&mut self, name: String) -> u32 {
        if let Some(&id) = self.ids.get(&name) {
            return id;
        }
        let id = self.files.len() as u32;
        self.files.push(name.clone());
        self.ids.insert(name, id);
        id
    }
}

/// A pipeline's clock and the service rates used to give operations plausible durations.
struct Clock<'r> {
    now_ns: u64,
    rank: u32,
    rng: &'r mut ChaCha8Rng,
}

const METADATA_NS: u64 = 80_000;
const DATA_LATENCY_NS: u64 = 30_000;
/// 1.5 GiB/s: a single-stream rate on a DataWarp fragment.
const DATA_BYTES_PER_SECOND: f64 = 1.5 * 1024.0 * 1024.0 * 1024.0;

impl Clock<'_> {
    fn emit(&mut self, builder: &mut Builder, op: Op, file: u32, offset: u64, length: u64) {
        let duration_ns = if op.is_data() {
            DATA_LATENCY_NS + (length as f64 / DATA_BYTES_PER_SECOND * 1e9) as u64
        } else {
            METADATA_NS / 2 + self.rng.gen_range(0..METADATA_NS)
        };
        builder.ops.push(TraceOp {
            time_ns: self.now_ns,
            duration_ns,
            offset,
            length,
            rank: self.rank,
            file,
            op,
        });
        // Think time between calls: the pipeline computes.
        self.now_ns += duration_ns + self.rng.gen_range(0..200_000);
    }

    fn transfer(&mut self, builder: &mut Builder, op: Op, file: u32, bytes: u64, transfer: u64) {
        let mut offset = 0;
        while offset < bytes {
            let length = transfer.min(bytes - offset);
            self.emit(builder, op, file, offset, length);
            offset += length;
        }
    }
}

/// Generates the workflow trace described by `shape`.
pub fn workflow(shape: &WorkflowShape) -> Result<Trace, SynthError> {
    shape.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(shape.seed);
    let mut builder = Builder { files: Vec::new(), ids: HashMap::new(), ops: Vec::new() };
    builder.ops.reserve(shape.estimated_ops() as usize);
    let transfer = shape.transfer_bytes;
    let mut end_ns = 0;
    for pipeline in 0..shape.pipelines {
        let start_ns = rng.gen_range(0..50_000_000);
        let mut clock = Clock { now_ns: start_ns, rank: pipeline, rng: &mut rng };
        for module in 0..shape.software_files {
            let file =
                builder.file(format!("/bb/env/lib/python3.11/site-packages/module_{module:04}.py"));
            clock.emit(&mut builder, Op::Stat, file, 0, 0);
            clock.emit(&mut builder, Op::Open, file, 0, 0);
            clock.emit(&mut builder, Op::Read, file, 0, 4096);
            clock.emit(&mut builder, Op::Close, file, 0, 0);
        }
        let mut intermediates = Vec::new();
        for index in 0..shape.inputs_per_pipeline {
            let image = clock.rng.gen_range(0..shape.input_pool);
            let input = builder.file(format!("/bb/input/image_{image:05}.fits"));
            clock.emit(&mut builder, Op::Open, input, 0, 0);
            clock.transfer(&mut builder, Op::Read, input, shape.input_bytes, transfer);
            clock.emit(&mut builder, Op::Close, input, 0, 0);
            let resampled =
                builder.file(format!("/bb/pipeline_{pipeline:04}/resampled_{index:03}.fits"));
            clock.emit(&mut builder, Op::Create, resampled, 0, 0);
            clock.transfer(&mut builder, Op::Write, resampled, shape.input_bytes, transfer);
            clock.emit(&mut builder, Op::Close, resampled, 0, 0);
            intermediates.push(resampled);
        }
        for &resampled in &intermediates {
            clock.emit(&mut builder, Op::Open, resampled, 0, 0);
            for _ in 0..shape.reread_passes {
                clock.transfer(&mut builder, Op::Read, resampled, shape.input_bytes, transfer);
            }
            clock.emit(&mut builder, Op::Close, resampled, 0, 0);
        }
        let output = builder.file(format!("/bb/pipeline_{pipeline:04}/coadd.fits"));
        clock.emit(&mut builder, Op::Create, output, 0, 0);
        clock.transfer(&mut builder, Op::Write, output, shape.input_bytes, transfer);
        clock.emit(&mut builder, Op::Fsync, output, 0, 0);
        clock.emit(&mut builder, Op::Close, output, 0, 0);
        for &resampled in &intermediates {
            clock.emit(&mut builder, Op::Unlink, resampled, 0, 0);
        }
        end_ns = end_ns.max(clock.now_ns);
    }
    builder.ops.sort_by_key(|op| op.time_ns);
    const START_UNIX_US: u64 = 1_700_000_000_000_000;
    let meta = JobMeta {
        uid: 1000,
        nprocs: shape.pipelines,
        job_id: shape.seed,
        start_unix_us: START_UNIX_US,
        end_unix_us: START_UNIX_US + end_ns.div_ceil(1000),
        synthesized: true,
        source: "spillway-synth-workflow".into(),
        executable: format!(
            "synthetic workflow: {} pipelines x {} inputs of {} bytes",
            shape.pipelines, shape.inputs_per_pipeline, shape.input_bytes
        ),
    };
    Ok(Trace { meta, files: builder.files, ops: builder.ops })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> WorkflowShape {
        WorkflowShape {
            pipelines: 2,
            inputs_per_pipeline: 3,
            input_pool: 4,
            input_bytes: 1 << 20,
            transfer_bytes: 256 << 10,
            reread_passes: 1,
            software_files: 5,
            seed: 9,
        }
    }

    #[test]
    fn same_seed_same_trace_and_marked_synthesized() {
        let first = workflow(&small()).unwrap();
        assert_eq!(first, workflow(&small()).unwrap());
        assert!(first.meta.synthesized);
        assert!(first.ops.windows(2).all(|pair| pair[0].time_ns <= pair[1].time_ns));
        let other = workflow(&WorkflowShape { seed: 10, ..small() }).unwrap();
        assert_ne!(first, other);
    }

    #[test]
    fn bytes_and_unlinks_follow_the_shape() {
        let trace = workflow(&small()).unwrap();
        let written: u64 =
            trace.ops.iter().filter(|op| op.op == Op::Write).map(|op| op.length).sum();
        // Per pipeline: 3 intermediates + 1 output of 1 MiB.
        assert_eq!(written, 2 * 4 * (1 << 20));
        let unlinks = trace.ops.iter().filter(|op| op.op == Op::Unlink).count();
        assert_eq!(unlinks, 2 * 3);
        assert!(trace.ops.len() as u64 <= small().estimated_ops());
    }

    #[test]
    fn absurd_shapes_are_refused() {
        let zero = WorkflowShape { transfer_bytes: 0, ..small() };
        assert_eq!(workflow(&zero), Err(SynthError::Zero { field: "transfer_bytes" }));
        let huge = WorkflowShape { pipelines: 100_000, transfer_bytes: 4096, ..small() };
        assert!(matches!(workflow(&huge), Err(SynthError::TooLarge { .. })));
    }
}
