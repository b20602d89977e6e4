//! Checkpoints written by `Model::train`: saved every N epochs, each save atomic,
//! so a process killed in the middle of a save leaves the previous checkpoint
//! loadable and predicting exactly what it predicted when it was saved.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aether::nn::{Dense, Flatten, ReLU};
use aether::{AetherError, Checkpoint, Device, Model, TrainOptions};
use common::{Rng, report};

/// Set in the child process the kill test starts: the checkpoint path.
const CHILD_ENV: &str = "AETHER_CHECKPOINT_KILL_CHILD";
const INPUT: [usize; 3] = [8, 8, 4];
const SAMPLES: usize = 16;
const PROBES: usize = 4;

/// A model whose file is a few MiB, so a save takes long enough to be hit.
fn model(device: &Device, hidden: usize) -> Model {
    let mut model = Model::new().seed(7);
    model
        .add(Flatten::default())
        .add(Dense::new(hidden))
        .add(ReLU::default())
        .add(Dense::new(10));
    common::ready_model(model, device, &INPUT)
}

/// Deterministic training data and probe inputs (the same in parent and child).
fn data() -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    let per: usize = INPUT.iter().product();
    let value = |i: usize| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5;
    let x = (0..SAMPLES * per).map(value).collect();
    let y = (0..SAMPLES as u32).map(|i| i % 10).collect();
    let probes = (0..PROBES * per).map(|i| value(i + 12345)).collect();
    (x, y, probes)
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "aether-{tag}-{}-{}",
        std::process::id(),
        Rng::fresh().next_u64()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn options(checkpoint: Option<Checkpoint>, epochs: usize) -> TrainOptions<'static> {
    TrainOptions {
        epochs,
        batch_size: 8,
        progress: false,
        checkpoint,
        ..TrainOptions::default()
    }
}

test_device!(
    checkpoint_every_n_epochs_holds_the_model_of_that_epoch,
    |device: &Device| {
        let (x, y, probes) = data();
        let dir = temp_dir("checkpoint-every");
        let path = dir.join("ckpt.aether");
        let checkpoint = Checkpoint {
            path: path.clone(),
            every_epochs: 2,
        };
        // Three epochs with a checkpoint every two: the file holds the model after epoch 2.
        let mut trained = model(device, 32);
        trained
            .train(&x, &y, &options(Some(checkpoint.clone()), 3))
            .unwrap();
        let mut after_two = model(device, 32);
        after_two.train(&x, &y, &options(None, 2)).unwrap();
        let expected = after_two.predict(&probes, PROBES, true).unwrap();
        let mut restored = Model::load(&path, device).unwrap();
        assert_eq!(restored.predict(&probes, PROBES, true).unwrap(), expected);
        let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "temporary files left: {leftovers:?}");

        let zero = Checkpoint {
            every_epochs: 0,
            ..checkpoint
        };
        match trained.train(&x, &y, &options(Some(zero), 1)) {
            Err(AetherError::Model(message)) => {
                assert!(message.contains("every_epochs"), "{message}")
            }
            other => panic!("expected a Model error for every_epochs 0, got {other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
);

/// The child: trains one epoch at a time with a checkpoint after each, and
/// after each prints the probe predictions of the model it just saved.
fn child(path: &Path) {
    let (x, y, probes) = data();
    let mut model = model(&Device::Cpu, 1024);
    let checkpoint = Checkpoint {
        path: path.to_owned(),
        every_epochs: 1,
    };
    let mut stdout = std::io::stdout().lock();
    for round in 0..10_000 {
        model
            .train(&x, &y, &options(Some(checkpoint.clone()), 1))
            .unwrap();
        let bits: Vec<String> = model
            .predict(&probes, PROBES, true)
            .unwrap()
            .iter()
            .map(|v| format!("{:08x}", v.to_bits()))
            .collect();
        writeln!(stdout, "saved {round} {}", bits.join(",")).unwrap();
        stdout.flush().unwrap();
    }
}

fn temp_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.to_string_lossy().contains(".tmp-"))
                .collect()
        })
        .unwrap_or_default()
}

/// One child run, killed as soon as a save's temporary file appears after the
/// first checkpoint exists. Returns whether the kill landed inside the save
/// (its temporary file is still there) and the last predictions printed.
fn kill_during_save(path: &Path) -> (bool, Option<String>) {
    let dir = path.parent().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "checkpoint_survives_a_kill_during_save",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_ENV, path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "the child never started a save");
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the child exited early: {status}");
        }
        if path.exists() && !temp_files(dir).is_empty() {
            break;
        }
        std::thread::yield_now();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let inside_save = !temp_files(dir).is_empty();
    let last = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(|l| l.ok())
        .filter_map(|l| l.strip_prefix("saved ").map(|rest| rest.to_owned()))
        .last();
    (inside_save, last)
}

#[test]
fn checkpoint_survives_a_kill_during_save() {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        child(Path::new(&path));
        return;
    }
    let dir = temp_dir("checkpoint-kill");
    let path = dir.join("ckpt.aether");
    let (_, _, probes) = data();
    for attempt in 1..=5 {
        let (inside_save, last) = kill_during_save(&path);
        // Whatever the timing, the file is a complete model.
        let mut restored = Model::load(&path, &Device::Cpu).unwrap();
        let predicted = restored.predict(&probes, PROBES, true).unwrap();
        // And it carries the optimizer's state: training can resume from it.
        Model::resume(&path, &Device::Cpu).expect("a checkpoint left by a kill resumes");
        if !inside_save {
            report(&format!(
                "[aether-test] attempt {attempt}: the save finished before the kill; again"
            ));
            continue;
        }
        // Killed inside save k+1: the file is checkpoint k, whose predictions
        // the child printed before it began training round k+1.
        let last = last.expect("the child printed the first checkpoint's predictions");
        let (round, bits) = last.split_once(' ').unwrap();
        let restored_bits: Vec<String> = predicted
            .iter()
            .map(|v| format!("{:08x}", v.to_bits()))
            .collect();
        assert_eq!(
            restored_bits.join(","),
            bits,
            "checkpoint {round} predicts differently after the kill"
        );
        report(&format!(
            "[aether-test] killed inside save {}: checkpoint {round} loads and predicts the same",
            round.parse::<usize>().unwrap() + 1
        ));
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    panic!("no kill landed inside a save in 5 attempts");
}
