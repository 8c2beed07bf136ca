import { partial } from '../../test/partial';
import { describe, expect, it } from 'vitest';
import type { Report, ReportVariant } from '../../api/types';
import { toCsv } from '../../components/csv';
import { compareReports, sharedGround } from './compare';

function variant(id: number, key: string, p50: number): ReportVariant {
  return partial<ReportVariant>({ id, key, precision: key, backend: 'onnxruntime', recipe: {}, latency_ms: { p50, p90: p50, p99: p50, mean: p50, std: 0 },
    throughput_per_s: null, peak_memory_mb: null, size_bytes: null, accuracy: { metric: 'cosine', value: 1, drop: 0, within_tolerance: true }, artifact: null, pareto: true });
}

function report(job: number, device: string, variants: ReportVariant[], recommended: number): Report {
  return partial<Report>({ job, status: 'succeeded', tolerance: { metric: 'auto', max_drop: 0.01 }, devices: [{ agent: { id: 1, name: device }, variants, recommended, reason: '' }] });
}

describe('compareReports', () => {
  it('matches the same variant on the same device and gives B over A', () => {
    const a = report(1, 'box', [variant(1, 'fp32', 2.0), variant(2, 'int8', 1.0)], 2);
    const b = report(2, 'box', [variant(3, 'fp32', 3.0), variant(4, 'fp16', 1.5)], 4);
    const rows = compareReports(a, b);
    expect(rows.map((row) => [row.variant, row.ratio, row.recommendedIn])).toEqual([
      ['fp16', null, ['b']],
      ['fp32', 1.5, []],
      ['int8', null, ['a']],
    ]);
    expect(sharedGround({ model: { id: 7 } }, { model: { id: 7 } }, rows)).toMatch(/^Same model on box/);
    expect(sharedGround({ model: { id: 7 } }, { model: { id: 8 } }, rows)).toMatch(/^Different models on box/);
    expect(sharedGround({ model: { id: 7, name: 'a', sha256: 'ab' } }, { model: { id: 8, name: 'b', sha256: 'ab' } }, rows)).toMatch(
      /^Same model \(a and b are byte-identical uploads\) on box/,
    );
    expect(sharedGround({ model: { id: 7, sha256: 'ab' } }, { model: { id: 8, sha256: 'cd' } }, rows)).toMatch(/^Different models/);
    expect(sharedGround({ model: { id: 7 } }, { model: { id: 8 } }, compareReports(a, report(2, 'other', [], 0)))).toMatch(/share neither/);
  });
});

describe('toCsv', () => {
  it('quotes commas, quotes and newlines, leaves numbers plain, and defuses formulas', () => {
    expect(toCsv(['a', 'b'], [[1.5, 'x,y'], ['say "hi"', null], ['=HYPERLINK("x")', true]])).toBe(
      'a,b\r\n1.5,"x,y"\r\n"say ""hi""",\r\n"\'=HYPERLINK(""x"")",true\r\n',
    );
  });
});
