import type { Capabilities } from '../api/types';

/** One line describing what a device agent reported about its hardware and runtimes. */
export function capabilitySummary(capabilities: Capabilities | null | undefined): string {
  const caps = capabilities ?? {};
  const parts: string[] = [];
  if (caps.cpu_model) parts.push(String(caps.cpu_model));
  else if (caps.arch) parts.push(String(caps.arch));
  if (caps.cores) parts.push(`${caps.cores} cores`);
  if (caps.memory_mb) parts.push(`${Math.round(Number(caps.memory_mb) / 1024)} GB`);
  if (caps.gpu && typeof caps.gpu === 'object') parts.push(String((caps.gpu as { name?: string }).name ?? 'GPU'));
  const runtimes = Object.entries(caps.runtimes ?? {}).map(([name, version]) => `${name} ${version}`);
  if (runtimes.length) parts.push(runtimes.join(', '));
  return parts.join(' · ');
}
