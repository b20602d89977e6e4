//! The CIFAR-10 binary reader on arbitrary bytes: a batch file and a
//! `batches.meta.txt`. Either a typed error or data that keeps the format's word.
#![no_main]

use std::path::Path;

use aether::datasets::cifar10::{IMAGE_VALUES, RECORD_BYTES, decode_batch, parse_class_names};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz/data_batch_1.bin");
    match decode_batch(path, data) {
        Ok((images, labels)) => {
            assert_eq!(labels.len() * RECORD_BYTES, data.len());
            assert_eq!(images.len(), labels.len() * IMAGE_VALUES);
            assert!(labels.iter().all(|&l| l < 10));
            assert!(images.iter().all(|v| (0.0..=1.0).contains(v)));
        }
        Err(e) => assert!(e.to_string().contains("data_batch_1.bin"), "{e}"),
    }
    if let Ok(names) = parse_class_names(Path::new("fuzz/batches.meta.txt"), data) {
        assert_eq!(names.len(), 10);
        assert!(names.iter().all(|n| !n.is_empty() && n.trim() == n));
    }
});
