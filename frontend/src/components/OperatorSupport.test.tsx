import { render, screen, within } from '@testing-library/react';
import { describe, expect, it } from 'vitest';
import type { SupportAnswer } from '../api/types';
import { OperatorSupportTable, opList } from './OperatorSupport';

const ANSWERS: SupportAnswer[] = [
  { backend: 'onnxruntime', runtime: 'ONNX Runtime', version: '1.32.0', device: 'CPUExecutionProvider', verdict: 'runs', native: { Loop: 1, MatMul: 1 },
    fallback: {}, unsupported: {}, where: 'server' },
  { backend: 'openvino', runtime: 'OpenVINO', version: '2026.4.1', device: 'CPU', verdict: 'cannot_run', native: {}, fallback: {},
    unsupported: { Loop: 1 }, nodes: { unsupported: ["Loop 'decoder'"] }, where: 'pi-5',
    reason: "OpenVINO 2026.4.1 cannot read the model (inside Loop 'decoder'): the loop-carried sequence pattern is not supported." },
];

describe('OperatorSupportTable', () => {
  it('shows each runtime with its verdict, its reason and the operators in each column', () => {
    render(<OperatorSupportTable answers={ANSWERS} showWhere />);
    const openvino = screen.getByText('OpenVINO').closest('tr') as HTMLElement;
    expect(openvino).toHaveAttribute('data-verdict', 'cannot_run');
    expect(within(openvino).getByText('Cannot run')).toBeInTheDocument();
    expect(openvino).toHaveTextContent("inside Loop 'decoder'");
    expect(openvino).toHaveTextContent('pi-5');
    const ort = screen.getByText('ONNX Runtime').closest('tr') as HTMLElement;
    expect(within(ort).getByText('Runs')).toBeInTheDocument();
    expect(ort).toHaveTextContent('this server');
    expect(ort).toHaveTextContent('Loop, MatMul');
  });

  it('lists op types with their counts and says how many more there are', () => {
    expect(opList({ Conv: 3, Relu: 1 })).toBe('Conv ×3, Relu');
    expect(opList({})).toBe('—');
    expect(opList({ A: 1, B: 1, C: 1 }, 2)).toBe('A, B and 1 more');
  });

  it('says a runtime that lists no operators did not itemise them, never "0 —", and keeps a count whole in a card', () => {
    const litert: SupportAnswer = { backend: 'litert', runtime: 'litert', version: '2.1.0', device: '', verdict: 'unknown', native: {}, fallback: {},
      unsupported: {}, where: 'server', reason: 'the litert backend cannot report operator support' };
    render(<OperatorSupportTable answers={[...ANSWERS, litert]} />);
    const row = screen.getByText('litert').closest('tr') as HTMLElement;
    expect(within(row).getByTestId('support-native')).toHaveTextContent('not itemised by litert');
    expect(within(row).getByTestId('support-native')).not.toHaveTextContent('0');
    const ort = screen.getByText('ONNX Runtime').closest('tr') as HTMLElement;
    expect(within(ort).getByTestId('support-native').querySelector('.nowrap')).toHaveTextContent('2');
  });
});
