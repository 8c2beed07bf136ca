import { describe, expect, it } from 'vitest';
import { deviceAddress, isLoopbackAddress, upCommand, withServer } from './DevicesPage';

describe('device set-up commands', () => {
  it('turns the server register command into the one that registers and runs', () => {
    expect(upCommand('kiln-agent register --server https://kiln.example --registration-token kiln_reg_x --name $(hostname)')).toBe(
      'kiln-agent up --server https://kiln.example --registration-token kiln_reg_x --name $(hostname)',
    );
    // Nothing but the leading sub-command changes, even if a value says "register".
    expect(upCommand('kiln-agent register --server https://register.example')).toBe('kiln-agent up --server https://register.example');
  });
});

describe('the server address devices use', () => {
  it('puts the typed address into the commands the server built for its own', () => {
    const register = 'kiln-agent register --server http://127.0.0.1:8000 --registration-token kiln_reg_x --name $(hostname)';
    expect(withServer(register, 'http://127.0.0.1:8000', 'http://192.168.1.20:8000')).toBe(
      'kiln-agent register --server http://192.168.1.20:8000 --registration-token kiln_reg_x --name $(hostname)',
    );
    expect(withServer('pip install --find-links http://127.0.0.1:8000/downloads/ kiln-agent onnxruntime', 'http://127.0.0.1:8000', 'http://pi-server:8000')).toBe(
      'pip install --find-links http://pi-server:8000/downloads/ kiln-agent onnxruntime',
    );
  });

  it('takes only http(s) URLs and knows loopback when it sees it', () => {
    expect(deviceAddress(' http://192.168.1.20:8000/ ')).toBe('http://192.168.1.20:8000');
    expect(deviceAddress('192.168.1.20:8000')).toBeNull();
    expect(deviceAddress('ftp://kiln')).toBeNull();
    for (const url of ['http://127.0.0.1:8000', 'http://localhost:8000', 'http://[::1]:8000', 'http://0.0.0.0']) expect(isLoopbackAddress(url)).toBe(true);
    expect(isLoopbackAddress('http://192.168.1.20:8000')).toBe(false);
  });
});
