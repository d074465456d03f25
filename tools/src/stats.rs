//! Small statistics used by the benchmark: median with min-max spread,
//! nearest-rank percentiles, and the least-squares line through
//! `(bytes, time)` points that the latency model fits.

/// Median, minimum and maximum of a set of runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

/// Median (mean of the two middle values for an even count), min and max.
/// NaN values are ignored; `None` when nothing is left.
pub fn summarize(xs: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Summary {
        median,
        min: v[0],
        max: v[n - 1],
        n,
    })
}

/// Nearest-rank percentile (`p` in 0..=100) of an ascending slice.
pub fn percentile_sorted(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let p = p.clamp(0.0, 100.0);
    // Nearest rank: the smallest value with at least p% of the values at or below it.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Mean of integer samples.
pub fn mean_u64(xs: &[u64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    Some(xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64)
}

/// `y = intercept + slope * x`, with Pearson's correlation coefficient.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    pub intercept: f64,
    pub slope: f64,
    pub r: f64,
    pub n: usize,
}

/// Ordinary least squares over paired points; `None` with fewer than two
/// points or when all x are equal.
pub fn least_squares(xs: &[f64], ys: &[f64]) -> Option<Fit> {
    let n = xs.len().min(ys.len());
    if n < 2 {
        return None;
    }
    let nf = n as f64;
    let mx = xs[..n].iter().sum::<f64>() / nf;
    let my = ys[..n].iter().sum::<f64>() / nf;
    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
    for i in 0..n {
        let dx = xs[i] - mx;
        let dy = ys[i] - my;
        sxx += dx * dx;
        sxy += dx * dy;
        syy += dy * dy;
    }
    if sxx == 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let r = if syy == 0.0 {
        1.0
    } else {
        sxy / (sxx * syy).sqrt()
    };
    Some(Fit {
        intercept: my - slope * mx,
        slope,
        r,
        n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_spread() {
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = summarize(&[4.0, 1.0, 3.0, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (3.5, 1.0, 10.0));
        let s = summarize(&[f64::NAN, 7.0]).unwrap();
        assert_eq!((s.median, s.n), (7.0, 1));
        assert!(summarize(&[]).is_none());
        assert!(summarize(&[f64::NAN]).is_none());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile_sorted(&v, 99.0), Some(99));
        assert_eq!(percentile_sorted(&v, 50.0), Some(50));
        assert_eq!(percentile_sorted(&v, 100.0), Some(100));
        assert_eq!(percentile_sorted(&v, 0.0), Some(1));
        assert_eq!(percentile_sorted(&[5], 99.0), Some(5));
        assert_eq!(percentile_sorted(&[], 99.0), None);
        let v = [10, 20, 30];
        assert_eq!(percentile_sorted(&v, 99.0), Some(30));
        assert_eq!(percentile_sorted(&v, 34.0), Some(20));
        assert_eq!(mean_u64(&v), Some(20.0));
    }

    #[test]
    fn least_squares_recovers_a_line() {
        // time = 40 us + bytes / 500 MB/s  (500 bytes per us)
        let xs: Vec<f64> = [512.0, 1024.0, 4096.0, 32768.0].to_vec();
        let ys: Vec<f64> = xs.iter().map(|x| 40.0 + x / 500.0).collect();
        let f = least_squares(&xs, &ys).unwrap();
        assert!((f.intercept - 40.0).abs() < 1e-9, "{f:?}");
        assert!((1.0 / f.slope - 500.0).abs() < 1e-6, "{f:?}");
        assert!((f.r - 1.0).abs() < 1e-12);
        assert_eq!(f.n, 4);
    }

    #[test]
    fn least_squares_correlation_of_noisy_and_degenerate_data() {
        let f = least_squares(&[1.0, 2.0, 3.0, 4.0], &[2.0, 1.0, 4.0, 3.0]).unwrap();
        // slope = 0.6, intercept = 1.0, r = 0.6 for this set.
        assert!((f.slope - 0.6).abs() < 1e-12, "{f:?}");
        assert!((f.intercept - 1.0).abs() < 1e-12, "{f:?}");
        assert!((f.r - 0.6).abs() < 1e-12, "{f:?}");
        let f = least_squares(&[1.0, 2.0, 3.0], &[5.0, 3.0, 1.0]).unwrap();
        assert!((f.r + 1.0).abs() < 1e-12);
        assert!(least_squares(&[1.0], &[1.0]).is_none());
        assert!(least_squares(&[2.0, 2.0], &[1.0, 3.0]).is_none());
    }
}
