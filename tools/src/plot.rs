//! The latency-model plot: throughput and mean latency against block size,
//! one line per target and direction, written as a self-contained SVG by
//! hand (no plotting crate, no font files: text is left to the viewer's
//! generic sans-serif).

use std::fmt::Write;

/// One line: `(bytes, value)` points.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub color: &'static str,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

/// A log-log panel.
struct Panel<'a> {
    x0: f64,
    y0: f64,
    w: f64,
    h: f64,
    title: &'a str,
    ylabel: &'a str,
}

/// Lower and upper powers of ten around the positive values.
pub fn decade_bounds(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in vals.filter(|v| *v > 0.0 && v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (1.0, 10.0);
    }
    let lo = 10f64.powf(lo.log10().floor());
    let mut hi = 10f64.powf(hi.log10().ceil());
    if hi <= lo {
        hi = lo * 10.0;
    }
    (lo, hi)
}

fn size_label(b: f64) -> String {
    let b = b as u64;
    if b >= 1 << 20 {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 {
        format!("{}K", b >> 10)
    } else {
        format!("{b}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn panel(svg: &mut String, p: &Panel<'_>, xs: (f64, f64), series: &[Series]) {
    let (ylo, yhi) = decade_bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let (xlo, xhi) = xs;
    let fx = |x: f64| p.x0 + (x.log2() - xlo.log2()) / (xhi.log2() - xlo.log2()) * p.w;
    let fy = |y: f64| p.y0 + p.h - (y.log10() - ylo.log10()) / (yhi.log10() - ylo.log10()) * p.h;
    let _ = writeln!(
        svg,
        r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#444"/>"##,
        p.x0, p.y0, p.w, p.h
    );
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="15">{}</text>"##,
        p.x0 + p.w / 2.0,
        p.y0 - 10.0,
        esc(p.title)
    );
    // x grid: every power of two, labelled every other one
    let mut x = xlo;
    let mut k = 0;
    while x <= xhi * 1.0001 {
        let px = fx(x);
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            p.y0,
            p.y0 + p.h
        );
        if k % 2 == 0 {
            let _ = writeln!(
                svg,
                r##"<text x="{px:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"##,
                p.y0 + p.h + 15.0,
                size_label(x)
            );
        }
        x *= 2.0;
        k += 1;
    }
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">block size (bytes)</text>"##,
        p.x0 + p.w / 2.0,
        p.y0 + p.h + 34.0
    );
    // y grid: decades
    let mut y = ylo;
    while y <= yhi * 1.0001 {
        let py = fy(y);
        let _ = writeln!(
            svg,
            r##"<line x1="{:.1}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/>"##,
            p.x0,
            p.x0 + p.w
        );
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{}</text>"##,
            p.x0 - 5.0,
            py + 4.0,
            if y >= 1.0 {
                format!("{y:.0}")
            } else {
                format!("{y}")
            }
        );
        y *= 10.0;
    }
    let _ = writeln!(
        svg,
        r##"<text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle" font-size="12">{}</text>"##,
        p.x0 - 48.0,
        p.y0 + p.h / 2.0,
        esc(p.ylabel)
    );
    for s in series {
        let pts: Vec<String> = s
            .points
            .iter()
            .filter(|(x, y)| *x > 0.0 && *y > 0.0 && y.is_finite())
            .map(|(x, y)| format!("{:.1},{:.1}", fx(*x), fy(*y)))
            .collect();
        if pts.is_empty() {
            continue;
        }
        let dash = if s.dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r##"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"##,
            pts.join(" "),
            s.color
        );
        for p in &pts {
            if let Some((a, b)) = p.split_once(',') {
                let _ = writeln!(
                    svg,
                    r##"<circle cx="{a}" cy="{b}" r="2.5" fill="{}"/>"##,
                    s.color
                );
            }
        }
    }
}

/// Two panels (throughput MB/s, mean latency us) over block size, with a
/// shared legend. `subtitle` names the machine and method.
pub fn latency_model_svg(
    title: &str,
    subtitle: &str,
    throughput: &[Series],
    latency: &[Series],
) -> String {
    let (w, h) = (1100.0, 520.0);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif">"##
    );
    let _ = writeln!(svg, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="24" text-anchor="middle" font-size="17">{}</text>"##,
        w / 2.0,
        esc(title)
    );
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="42" text-anchor="middle" font-size="11" fill="#555">{}</text>"##,
        w / 2.0,
        esc(subtitle)
    );
    let xs = decade_x(throughput.iter().chain(latency.iter()));
    panel(
        &mut svg,
        &Panel {
            x0: 80.0,
            y0: 80.0,
            w: 400.0,
            h: 340.0,
            title: "Throughput at QD 1",
            ylabel: "MB/s",
        },
        xs,
        throughput,
    );
    panel(
        &mut svg,
        &Panel {
            x0: 600.0,
            y0: 80.0,
            w: 400.0,
            h: 340.0,
            title: "Mean latency at QD 1",
            ylabel: "microseconds",
        },
        xs,
        latency,
    );
    // legend
    let mut lx = 80.0;
    let ly = 480.0;
    for s in throughput {
        let dash = if s.dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r##"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{dash}/>"##,
            lx + 28.0,
            s.color
        );
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" font-size="12">{}</text>"##,
            lx + 33.0,
            ly + 4.0,
            esc(&s.label)
        );
        lx += 170.0;
    }
    svg.push_str("</svg>\n");
    svg
}

fn decade_x<'a>(series: impl Iterator<Item = &'a Series>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for s in series {
        for p in &s.points {
            if p.0 > 0.0 {
                lo = lo.min(p.0);
                hi = hi.max(p.0);
            }
        }
    }
    if !lo.is_finite() || hi <= lo {
        return (512.0, 8.0 * 1048576.0);
    }
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decades_enclose_values() {
        assert_eq!(decade_bounds([3.0, 420.0].into_iter()), (1.0, 1000.0));
        assert_eq!(decade_bounds([0.0, f64::NAN].into_iter()), (1.0, 10.0));
        assert_eq!(decade_bounds([100.0].into_iter()), (100.0, 1000.0));
        assert_eq!(size_label(512.0), "512");
        assert_eq!(size_label(65536.0), "64K");
        assert_eq!(size_label(8.0 * 1048576.0), "8M");
    }

    #[test]
    fn svg_has_one_polyline_per_series() {
        let s = |label: &str, dashed| Series {
            label: label.into(),
            color: "#1f77b4",
            dashed,
            points: vec![(512.0, 10.0), (1024.0, 20.0), (2048.0, 0.0)],
        };
        let t = [s("a read", false), s("a write", true)];
        let svg = latency_model_svg("t <x>", "sub", &t, &t);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 4);
        // the zero point is left out of the line
        assert_eq!(svg.matches("<circle").count(), 8);
        assert!(svg.contains("t &lt;x&gt;"));
    }
}
