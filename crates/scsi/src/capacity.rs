//! READ CAPACITY (10) and (16) parameter data (SBC-4 §5.20, §5.21).

/// What READ CAPACITY reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct Capacity {
    pub num_blocks: u64,
    pub block_size: u32,
    /// Logical blocks per physical block exponent.
    pub phys_exp: u8,
    /// LBPME: logical block provisioning management (UNMAP and friends).
    pub lbpme: bool,
    /// LBPRZ: unmapped blocks read as zero.
    pub lbprz: bool,
}

impl Capacity {
    fn last_lba(&self) -> u64 {
        self.num_blocks.saturating_sub(1)
    }

    /// SBC-4 §5.20.2: 8 bytes; RETURNED LOGICAL BLOCK ADDRESS is FFFFFFFFh if
    /// the last LBA does not fit, telling the initiator to use (16).
    pub fn read_capacity_10(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        let lba = u32::try_from(self.last_lba()).unwrap_or(u32::MAX);
        b[..4].copy_from_slice(&lba.to_be_bytes());
        b[4..].copy_from_slice(&self.block_size.to_be_bytes());
        b
    }

    /// SBC-4 §5.21.2: 32 bytes, protection disabled.
    pub fn read_capacity_16(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&self.last_lba().to_be_bytes());
        b[8..12].copy_from_slice(&self.block_size.to_be_bytes());
        // b[12]: P_TYPE, PROT_EN = 0. b[13]: P_I_EXPONENT = 0, LBPPBE.
        b[13] = self.phys_exp & 0x0f;
        // b[14..16]: LBPME, LBPRZ, LOWEST ALIGNED LBA = 0.
        if self.lbpme {
            b[14] |= 0x80;
        }
        if self.lbprz {
            b[14] |= 0x40;
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_and_sixteen() {
        let c = Capacity {
            num_blocks: 2048,
            block_size: 512,
            phys_exp: 3,
            lbpme: true,
            lbprz: false,
        };
        assert_eq!(c.read_capacity_10(), [0, 0, 7, 0xff, 0, 0, 2, 0]);
        let b = c.read_capacity_16();
        assert_eq!(&b[..8], &2047u64.to_be_bytes());
        assert_eq!(&b[8..12], &512u32.to_be_bytes());
        assert_eq!((b[12], b[13], b[14]), (0, 3, 0x80));
        let big = Capacity {
            num_blocks: 1 << 40,
            block_size: 4096,
            ..Default::default()
        };
        assert_eq!(&big.read_capacity_10()[..4], &[0xff; 4]);
        assert_eq!(
            &big.read_capacity_16()[..8],
            &((1u64 << 40) - 1).to_be_bytes()
        );
    }
}
