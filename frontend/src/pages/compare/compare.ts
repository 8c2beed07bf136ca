/** Two deployments side by side: the same variant on the same device and backend, matched across both reports. */
import type { Report, ReportVariant } from '../../api/types';

export interface ComparedRow {
  key: string;
  variant: string;
  backend: string;
  device: string;
  a: ReportVariant | null;
  b: ReportVariant | null;
  /** p50 of B over p50 of A: below 1, B is faster. */
  ratio: number | null;
  recommendedIn: ('a' | 'b')[];
}

function deviceName(device: Report['devices'][number]): string {
  return device.agent?.name ?? device.target ?? 'device';
}

function indexReport(report: Report | undefined) {
  const rows = new Map<string, { variant: ReportVariant; device: string; recommended: boolean }>();
  for (const device of report?.devices ?? []) {
    for (const variant of device.variants) {
      const key = `${variant.key ?? variant.precision}|${variant.backend}|${deviceName(device)}`;
      rows.set(key, { variant, device: deviceName(device), recommended: device.recommended === variant.id });
    }
  }
  return rows;
}

export function compareReports(a: Report | undefined, b: Report | undefined): ComparedRow[] {
  const left = indexReport(a);
  const right = indexReport(b);
  const keys = [...new Set([...left.keys(), ...right.keys()])].sort();
  return keys.map((key) => {
    const [variant, backend, device] = key.split('|');
    const one = left.get(key);
    const two = right.get(key);
    const p50a = one?.variant.latency_ms?.p50;
    const p50b = two?.variant.latency_ms?.p50;
    return {
      key, variant, backend, device,
      a: one?.variant ?? null, b: two?.variant ?? null,
      ratio: p50a && p50b ? p50b / p50a : null,
      recommendedIn: [...(one?.recommended ? (['a'] as const) : []), ...(two?.recommended ? (['b'] as const) : [])],
    };
  });
}

/** What the two deployments share, which says what the comparison means. */
type JobModel = { model?: { id: number; name?: string; sha256?: string } | null };

export function sharedGround(a: JobModel | undefined, b: JobModel | undefined, rows: ComparedRow[]): string {
  const sameId = !!a?.model && a.model.id === b?.model?.id;
  // Byte-identical uploads are the same model under two names.
  const sameBytes = !!a?.model?.sha256 && a.model.sha256 === b?.model?.sha256;
  const sameModel = sameId || sameBytes;
  const sharedDevices = new Set(rows.filter((row) => row.a && row.b).map((row) => row.device));
  if (sameBytes && !sameId) {
    const names = `${a?.model?.name ?? 'one'} and ${b?.model?.name ?? 'the other'}`;
    return sharedDevices.size > 0
      ? `Same model (${names} are byte-identical uploads) on ${[...sharedDevices].join(', ')}: the ratio is what changed between the two runs.`
      : `Same model (${names} are byte-identical uploads) on different devices: compare the devices.`;
  }
  if (sameModel && sharedDevices.size > 0) return `Same model on ${[...sharedDevices].join(', ')}: the ratio is what changed between the two runs.`;
  if (sameModel) return 'Same model on different devices: compare the devices.';
  if (sharedDevices.size > 0) return `Different models on ${[...sharedDevices].join(', ')}: compare the models on one device.`;
  return 'These deployments share neither the model nor a device; pick two that share one for a fair comparison.';
}
