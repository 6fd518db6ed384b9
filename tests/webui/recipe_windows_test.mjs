// The tensor page's recipe windows (server/webui/assets/recipe_windows.js), binade by binade,
// against the element formats' limits (OCP 8-bit FP and Microscaling v1.0: E4M3 normal
// 2^-6..448, subnormal down to 2^-9; E2M1 normal 1..6, subnormal 0.5).
//   node --test tests/webui/recipe_windows_test.mjs
import assert from 'node:assert/strict';
import test from 'node:test';
import { bandText, blockBand, perTensorWindow, region }
  from '../../server/webui/assets/recipe_windows.js';

// The API's format objects, as formats_json writes them.
const E4M3 = { name: 'e4m3', max: 448, min_normal: 2 ** -6, min_subnormal: 2 ** -9,
               max_exponent: 8, min_normal_exponent: -6, min_subnormal_exponent: -9 };
const E2M1 = { name: 'e2m1', max: 6, min_normal: 1, min_subnormal: 0.5,
               max_exponent: 2, min_normal_exponent: 0, min_subnormal_exponent: -1 };

const regionOf = (w, e) => region(w, 2 ** e, 2 ** (e + 1));

test('RecipeWindows.PerTensorScaleShiftsTheElementWindowDown', () => {
  // e4m3:scale=16 stores 16x: overflow above 448/16 = 28, normal down to 2^-10, subnormal 2^-13.
  const w = perTensorWindow(E4M3, 16);
  assert.deepEqual(w, { max: 28, min_normal: 2 ** -10, min_subnormal: 2 ** -13 });
  assert.equal(regionOf(w, 5), 'overflow');            // [32, 64)
  assert.equal(regionOf(w, 4), 'overflows in part');   // [16, 32) holds 28
  assert.equal(regionOf(w, 3), 'normal');
  assert.equal(regionOf(w, -10), 'normal');
  assert.equal(regionOf(w, -11), 'subnormal');
  assert.equal(regionOf(w, -13), 'subnormal');
  assert.equal(regionOf(w, -14), 'flushed to zero (underflow)');
});

test('RecipeWindows.LossScaleAndTensorScaleMultiply', () => {
  // An output gradient at loss scale 2^10 under current scaling s = 2^-3: 2^7 in all.
  const w = perTensorWindow(E4M3, 2 ** -3, 2 ** 10);
  assert.equal(w.max, 448 / 128);
  assert.equal(w.min_normal, 2 ** -13);
  assert.equal(w.min_subnormal, 2 ** -16);
  // No scale (0: a block recipe's tensor_scale) is 1.
  assert.deepEqual(perTensorWindow(E4M3, 0),
                   { max: 448, min_normal: 2 ** -6, min_subnormal: 2 ** -9 });
});

test('RecipeWindows.MxBandIsTheUnionOfTheBlocksWindows', () => {
  // MXFP8 E4M3: two blocks with X = 2^-3, one with X = 2^-1 (E8M0: exact powers of two).
  // X = 2^-3 keeps binades -9..5 normal and -12..-10 subnormal; X = 2^-1 -7..7 and -10..-8.
  const band = blockBand(E4M3, { min_exponent: -3, counts: [2, 0, 1] });
  assert.equal(band.blocks, 3);
  assert.equal(band.top, 7);
  assert.equal(band.bottom, -12);
  assert.deepEqual(band.allNormal, [-7, 5]);
  const byE = Object.fromEntries(band.rows.map((r) => [r.e, [r.normal, r.subnormal]]));
  assert.deepEqual(Object.keys(byE).map(Number).sort((a, b) => a - b),
                   Array.from({ length: 20 }, (_, i) => i - 12));
  assert.deepEqual(byE[-12], [0, 2]);
  assert.deepEqual(byE[-11], [0, 2]);
  assert.deepEqual(byE[-10], [0, 3]);
  assert.deepEqual(byE[-9], [2, 1]);
  assert.deepEqual(byE[-8], [2, 1]);
  assert.deepEqual(byE[-7], [3, 0]);
  assert.deepEqual(byE[5], [3, 0]);
  assert.deepEqual(byE[6], [1, 0]);
  assert.deepEqual(byE[7], [1, 0]);
  assert.equal(bandText(band, -9), 'normal in 2 of 3 blocks, subnormal in 1');
  assert.equal(bandText(band, 8), 'kept by none of 3 blocks');
});

test('RecipeWindows.Fp4BlocksKeepFourBinadesEach', () => {
  // E2M1 under decode scales in [2^-4, 2^-3) and [2^0, 2^1): normal binades k..k+2, subnormal k-1.
  const band = blockBand(E2M1, { min_exponent: -4, counts: [5, 0, 0, 0, 1] });
  assert.deepEqual(band.rows.map((r) => [r.e, r.normal, r.subnormal]),
                   [[-5, 0, 5], [-4, 5, 0], [-3, 5, 0], [-2, 5, 0], [-1, 0, 1], [0, 1, 0],
                    [1, 1, 0], [2, 1, 0]]);
  assert.equal(band.top, 2);
  assert.equal(band.bottom, -5);
  // No binade is normal in every block: the two scales are too far apart.
  assert.equal(band.allNormal, null);
});

test('RecipeWindows.LossScaleShiftsTheBand', () => {
  // The same MX block of a gradient at loss scale 2^8: its values are 2^-8 of what was stored.
  const band = blockBand(E4M3, { min_exponent: 0, counts: [1] }, 2 ** 8);
  assert.equal(band.top, 0);
  assert.equal(band.bottom, -17);
  assert.deepEqual(band.allNormal, [-14, 0]);
});

test('RecipeWindows.NoBlocksNoBand', () => {
  assert.deepEqual(blockBand(E4M3, null),
                   { blocks: 0, rows: [], top: null, bottom: null, allNormal: null });
  assert.equal(blockBand(E4M3, { min_exponent: 3, counts: [0, 0] }).blocks, 0);
});
