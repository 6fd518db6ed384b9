// Where a format or a scaled recipe keeps a tensor's values, in the tensor's unscaled domain.
// Pure functions (no DOM): the heatmap draws them, tests/webui/recipe_windows_test.mjs checks
// them binade by binade. docs/webui.md ("A tensor") states each rule.
//
// A window is {max, min_normal, min_subnormal}: values above max overflow (saturate, for the FP8
// and FP4 elements), values down to min_normal are normal, down to min_subnormal subnormal, and
// smaller ones flush to zero. An element format is the API's format object (its limits and their
// exponents: max_exponent = floor(log2 max), min_normal_exponent, min_subnormal_exponent).

// A per-tensor recipe (current or delayed scaling, NVFP4's own tensor scale aside) stores
// x * L * s, L the loss scale the input carried and s the recipe's tensor scale: in x's domain
// the element's window is its limits divided by L * s. A scale of 0 or less (none) counts as 1.
export function perTensorWindow(element, tensorScale, lossScale = 1) {
  const k = (tensorScale > 0 ? tensorScale : 1) * (lossScale > 0 ? lossScale : 1);
  const { max, min_normal, min_subnormal } = element;
  return { max: max / k, min_normal: min_normal / k, min_subnormal: min_subnormal / k };
}

// Where the binade [lo, hi) falls in window w.
export function region(w, lo, hi) {
  if (lo > w.max) return 'overflow';
  if (hi > w.max) return 'overflows in part';
  if (lo >= w.min_normal) return 'normal';
  if (lo >= w.min_subnormal) return 'subnormal';
  if (hi > w.min_subnormal) return 'subnormal, partly flushed to zero';
  return 'flushed to zero (underflow)';
}

// A block recipe (MX, NVFP4, tiles) gives each block its own decode scale d: the block's values
// are x = q * d (times L, the loss scale the input carried), so its window is the element's
// shifted by log2(d / L) binades. `histogram` is the quantiser's scale_histogram: counts[i]
// blocks had floor(log2 d) = min_exponent + i. The band is the union of the blocks' windows, per
// binade e of x ([2^e, 2^(e+1))): in how many blocks e is normal (element binades
// min_normal_exponent..max_exponent) and in how many subnormal (min_subnormal_exponent ..
// min_normal_exponent - 1); the rest of the blocks flush it to zero or never reach it. Exact
// for E8M0 scales (MX: d is a power of two); for FP32 and E4M3 scales (tiles, NVFP4) d lies in
// [2^k, 2^(k+1)) and each edge is within one binade of the one drawn.
//   -> {blocks, rows: [{e, normal, subnormal}] ascending, top, bottom, allNormal: [lo, hi] | null}
// top/bottom: the highest binade some block keeps normal and the lowest some block keeps at all;
// allNormal: the binades every block keeps normal (null when there is none).
export function blockBand(element, histogram, lossScale = 1) {
  const empty = { blocks: 0, rows: [], top: null, bottom: null, allNormal: null };
  if (!histogram || !histogram.counts || histogram.counts.length === 0) return empty;
  const shift = lossScale > 0 ? Math.floor(Math.log2(lossScale)) : 0;
  const rows = new Map();
  const add = (e, kind, n) => {
    const row = rows.get(e) || { e, normal: 0, subnormal: 0 };
    row[kind] += n;
    rows.set(e, row);
  };
  let blocks = 0;
  let kMin = Infinity;
  let kMax = -Infinity;
  histogram.counts.forEach((n, i) => {
    if (!(n > 0)) return;
    const k = histogram.min_exponent + i - shift;
    blocks += n;
    kMin = Math.min(kMin, k);
    kMax = Math.max(kMax, k);
    for (let j = element.min_subnormal_exponent; j <= element.max_exponent; j += 1) {
      add(k + j, j < element.min_normal_exponent ? 'subnormal' : 'normal', n);
    }
  });
  if (blocks === 0) return empty;
  const lo = kMax + element.min_normal_exponent;
  const hi = kMin + element.max_exponent;
  return {
    blocks,
    rows: [...rows.values()].sort((a, b) => a.e - b.e),
    top: kMax + element.max_exponent,
    bottom: kMin + element.min_subnormal_exponent,
    allNormal: lo <= hi ? [lo, hi] : null,
  };
}

// The band's words for binade e (the hover text).
export function bandText(band, e) {
  const row = band.rows.find((r) => r.e === e);
  if (!row) return `kept by none of ${band.blocks} blocks`;
  const parts = [`normal in ${row.normal} of ${band.blocks} blocks`];
  if (row.subnormal) parts.push(`subnormal in ${row.subnormal}`);
  return parts.join(', ');
}
