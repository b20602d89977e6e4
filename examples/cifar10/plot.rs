//! Training curves as a PNG: loss and accuracy per epoch, train and test, drawn
//! with plotters' bitmap backend. Text is rendered by ab_glyph from the Noto
//! Sans font that the `ttf-noto-sans` crate embeds, so no system font library
//! (fontconfig, freetype) is needed.

use std::error::Error;
use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::run::EpochReport;
use aether::{AetherError, Result};

const SIZE: (u32, u32) = (1200, 500);
const TRAIN_COLOR: RGBColor = RGBColor(31, 119, 180);
const TEST_COLOR: RGBColor = RGBColor(255, 127, 14);

/// Writes `path` (a PNG): two panels, loss and accuracy per epoch, each with a
/// train and a test curve, under `title`.
pub fn plot_training(path: &Path, title: &str, epochs: &[EpochReport]) -> Result<()> {
    draw(path, title, epochs).map_err(|e| AetherError::Io {
        action: "write plot",
        path: path.to_owned(),
        source: std::io::Error::other(e.to_string()),
    })
}

fn register_font() -> Result<(), String> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, ttf_noto_sans::REGULAR)
            .is_ok()
    });
    ok.then_some(())
        .ok_or_else(|| "the embedded Noto Sans font did not load".to_owned())
}

fn draw(path: &Path, title: &str, epochs: &[EpochReport]) -> Result<(), Box<dyn Error>> {
    if epochs.is_empty() {
        return Err("no epochs to plot".into());
    }
    register_font()?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let body = root.titled(title, ("sans-serif", 26))?;
    let panels = body.split_evenly((1, 2));
    let pick = |f: fn(&EpochReport) -> f32| epochs.iter().map(f).collect::<Vec<f32>>();
    let (train_loss, test_loss) = (pick(|e| e.train_loss), pick(|e| e.test_loss));
    let loss_max = train_loss
        .iter()
        .chain(&test_loss)
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0f32, f32::max);
    panel(
        &panels[0],
        "loss",
        0.0..(loss_max * 1.1).max(1e-3),
        [("train loss", train_loss), ("test loss", test_loss)],
        SeriesLabelPosition::UpperRight,
    )?;
    panel(
        &panels[1],
        "accuracy",
        0.0..1.0,
        [
            ("train accuracy", pick(|e| e.train_accuracy)),
            ("test accuracy", pick(|e| e.test_accuracy)),
        ],
        SeriesLabelPosition::LowerRight,
    )?;
    root.present()?;
    Ok(())
}

/// One chart: epochs 1..=n on x (with a blank epoch of margin on each side so
/// a single epoch is still visible), train then test values on y.
fn panel(
    area: &DrawingArea<BitMapBackend, Shift>,
    caption: &str,
    y_range: std::ops::Range<f32>,
    series: [(&str, Vec<f32>); 2],
    legend: SeriesLabelPosition,
) -> Result<(), Box<dyn Error>> {
    let n = series[0].1.len() as i32;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(0..n + 1, y_range)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .light_line_style(RGBColor(238, 238, 238))
        .x_labels((n as usize + 2).min(12))
        .x_label_formatter(&|&x| {
            if (1..=n).contains(&x) {
                x.to_string()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y:.2}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()?;
    for ((label, values), color) in series.into_iter().zip([TRAIN_COLOR, TEST_COLOR]) {
        let points: Vec<(i32, f32)> = (1..).zip(values).filter(|(_, v)| v.is_finite()).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], color.stroke_width(2)));
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(legend)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
