//! Resource quantities (`k8s.io/apimachinery/pkg/api/resource`): parsed,
//! rounded and written back in canonical form, as kube-apiserver writes
//! them when it defaults a resource list.

use std::cmp::Ordering;

/// How a quantity was written, which decides how it is written back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    /// `m`, `k`, `M`, ... or no suffix.
    DecimalSi,
    /// `Ki`, `Mi`, ...
    BinarySi,
    /// `e3`, `E-2`, ...
    DecimalExponent,
}

/// A parsed quantity: `(-1 if negative) * mantissa * 10^exponent`.
#[derive(Clone, Debug)]
pub(super) struct Qty {
    negative: bool,
    mantissa: u128,
    exponent: i32,
    format: Format,
    /// The text as given, kept when Go keeps it (it was already in
    /// canonical form, by Go's quick test).
    text: Option<String>,
}

pub(super) fn pow10(n: u32) -> Option<u128> {
    10u128.checked_pow(n)
}

impl Qty {
    /// `resource.ParseQuantity`, including its rounding up to nano-units,
    /// the cap of binary quantities at 2^63-1, and whether it keeps the
    /// given text.
    pub(super) fn parse(s: &str) -> Result<Qty, &'static str> {
        if s.is_empty() {
            return Err("empty");
        }
        if s == "0" {
            return Ok(Qty {
                negative: false,
                mantissa: 0,
                exponent: 0,
                format: Format::DecimalSi,
                text: Some(s.to_owned()),
            });
        }
        let b = s.as_bytes();
        let mut pos = 0;
        let mut negative = false;
        match b[0] {
            b'-' => {
                negative = true;
                pos += 1;
            }
            b'+' => pos += 1,
            _ => {}
        }
        while pos < b.len() && b[pos] == b'0' {
            pos += 1;
        }
        let digits = |pos: &mut usize| {
            let start = *pos;
            while *pos < b.len() && b[*pos].is_ascii_digit() {
                *pos += 1;
            }
            &s[start..*pos]
        };
        let mut num = digits(&mut pos);
        if num.is_empty() {
            num = "0";
        }
        let mut denom = "";
        if pos < b.len() && b[pos] == b'.' {
            pos += 1;
            denom = digits(&mut pos);
        }
        let suffix_start = pos;
        while pos < b.len() && b"eEinumkKMGTP".contains(&b[pos]) {
            pos += 1;
        }
        if pos < b.len() && matches!(b[pos], b'-' | b'+') {
            pos += 1;
        }
        digits(&mut pos);
        if pos < b.len() {
            return Err("not of the form <number><suffix>");
        }
        let suffix = &s[suffix_start..];
        let (binary, scale, format) = match suffix {
            "" => (false, 0, Format::DecimalSi),
            "n" => (false, -9, Format::DecimalSi),
            "u" => (false, -6, Format::DecimalSi),
            "m" => (false, -3, Format::DecimalSi),
            "k" => (false, 3, Format::DecimalSi),
            "M" => (false, 6, Format::DecimalSi),
            "G" => (false, 9, Format::DecimalSi),
            "T" => (false, 12, Format::DecimalSi),
            "P" => (false, 15, Format::DecimalSi),
            "E" => (false, 18, Format::DecimalSi),
            "Ki" => (true, 10, Format::BinarySi),
            "Mi" => (true, 20, Format::BinarySi),
            "Gi" => (true, 30, Format::BinarySi),
            "Ti" => (true, 40, Format::BinarySi),
            "Pi" => (true, 50, Format::BinarySi),
            "Ei" => (true, 60, Format::BinarySi),
            _ if suffix.len() > 1 && suffix.starts_with(['e', 'E']) => {
                let exponent = suffix[1..].parse::<i32>().map_err(|_| "bad exponent")?;
                (false, exponent, Format::DecimalExponent)
            }
            _ => return Err("unknown suffix"),
        };

        // The exact value.
        let all = format!("{num}{denom}");
        let significant = all.trim_start_matches('0');
        let trimmed = significant.trim_end_matches('0');
        if trimmed.len() > 38 {
            return Err("more than 38 significant digits");
        }
        let mut mantissa: u128 = if trimmed.is_empty() {
            0
        } else {
            trimmed.parse().map_err(|_| "not a number")?
        };
        let zeros = i64::try_from(significant.len() - trimmed.len()).map_err(|_| "too long")?;
        let denom_len = i64::try_from(denom.len()).map_err(|_| "too long")?;
        let mut exponent = zeros - denom_len;
        if binary {
            mantissa = mantissa.checked_mul(1u128 << scale).ok_or("too large")?;
        } else {
            exponent += i64::from(scale);
        }
        if mantissa == 0 {
            exponent = 0;
        }
        let mut exponent = i32::try_from(exponent).map_err(|_| "exponent out of range")?;
        // Non-zero values round up (away from zero) to nano-units.
        if mantissa != 0 && exponent < -9 {
            let shift =
                u32::try_from(-9 - i64::from(exponent)).map_err(|_| "exponent out of range")?;
            mantissa = match pow10(shift) {
                Some(div) => mantissa.div_ceil(div),
                None => 1,
            };
            exponent = -9;
        }
        let mut q = Qty {
            negative,
            mantissa,
            exponent,
            format,
            text: None,
        };
        q.normalize();
        if format == Format::BinarySi {
            if q.cmp_magnitude(&Qty::integer(i64::MAX.unsigned_abs().into())) == Ordering::Greater {
                q.mantissa = i64::MAX.unsigned_abs().into();
                q.exponent = 0;
                q.normalize();
            }
            if q.mantissa != 0 && q.cmp_magnitude(&Qty::integer(1)) == Ordering::Less {
                q.format = Format::DecimalSi;
            }
        }

        // Go keeps the text when its int64 fast path applies and the text
        // looks canonical.
        let precision = if binary {
            if denom.is_empty() {
                15 - num.len() as i64 - i64::from(scale) * 3 / 10 - 1
            } else {
                -1
            }
        } else {
            18 - (num.len() + denom.len()) as i64
        };
        let go_scale = if binary { 0 } else { i64::from(scale) } - denom_len;
        if precision >= 0 && go_scale >= -9 {
            let shifted = format!("{num}{denom}");
            let value = shifted.parse::<i64>().ok();
            let fits = value.and_then(|v| {
                if binary {
                    v.checked_mul(1i64 << scale)
                } else {
                    Some(v)
                }
            });
            if let (Some(value), Some(_)) = (value, fits) {
                let canonical = if binary {
                    value & 0x07 != 0
                } else {
                    go_scale % 3 == 0 && !shifted.ends_with("000") && !shifted.starts_with('0')
                };
                if canonical {
                    q.text = Some(s.to_owned());
                }
            }
        }
        Ok(q)
    }

    pub(super) fn integer(value: u128) -> Qty {
        let mut q = Qty {
            negative: false,
            mantissa: value,
            exponent: 0,
            format: Format::DecimalSi,
            text: None,
        };
        q.normalize();
        q
    }

    /// Moves trailing zeros of the mantissa into the exponent.
    pub(super) fn normalize(&mut self) {
        if self.mantissa == 0 {
            self.exponent = 0;
            self.negative = false;
            return;
        }
        while self.mantissa.is_multiple_of(10) {
            self.mantissa /= 10;
            self.exponent += 1;
        }
    }

    pub(super) fn is_positive(&self) -> bool {
        !self.negative && self.mantissa != 0
    }

    /// Number of decimal digits of the mantissa (0 for zero).
    pub(super) fn digits(&self) -> i64 {
        let mut n = 0;
        let mut m = self.mantissa;
        while m != 0 {
            m /= 10;
            n += 1;
        }
        n
    }

    /// Compares absolute values.
    pub(super) fn cmp_magnitude(&self, other: &Qty) -> Ordering {
        match (self.mantissa == 0, other.mantissa == 0) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        let order = |q: &Qty| q.digits() + i64::from(q.exponent);
        match order(self).cmp(&order(other)) {
            Ordering::Equal => {}
            unequal => return unequal,
        }
        // Same order of magnitude: align on the smaller exponent.
        let low = self.exponent.min(other.exponent);
        let scaled = |q: &Qty| {
            u32::try_from(i64::from(q.exponent) - i64::from(low))
                .ok()
                .and_then(pow10)
                .and_then(|f| q.mantissa.checked_mul(f))
        };
        match (scaled(self), scaled(other)) {
            (Some(a), Some(b)) => a.cmp(&b),
            (None, _) => Ordering::Greater,
            (_, None) => Ordering::Less,
        }
    }

    /// Compares values.
    pub(super) fn cmp_value(&self, other: &Qty) -> Ordering {
        let sign = |q: &Qty| match (q.mantissa == 0, q.negative) {
            (true, _) => 0,
            (false, true) => -1,
            (false, false) => 1,
        };
        match sign(self).cmp(&sign(other)) {
            Ordering::Equal if sign(self) < 0 => other.cmp_magnitude(self),
            Ordering::Equal => self.cmp_magnitude(other),
            unequal => unequal,
        }
    }

    /// `Quantity.Add`: the sum keeps this quantity's format (or takes the
    /// other's when this is zero) and loses the given text.
    pub(super) fn add(&mut self, other: &Qty) -> Result<(), &'static str> {
        if self.mantissa == 0 {
            self.format = other.format;
        }
        self.text = None;
        let low = self.exponent.min(other.exponent);
        let scaled = |q: &Qty| {
            u32::try_from(i64::from(q.exponent) - i64::from(low))
                .ok()
                .and_then(pow10)
                .and_then(|f| q.mantissa.checked_mul(f))
                .ok_or("sum out of range")
        };
        let (a, b) = (scaled(self)?, scaled(other)?);
        let (negative, mantissa) = if self.negative == other.negative {
            (self.negative, a.checked_add(b).ok_or("sum out of range")?)
        } else if a >= b {
            (self.negative, a - b)
        } else {
            (other.negative, b - a)
        };
        self.negative = negative;
        self.mantissa = mantissa;
        self.exponent = low;
        self.normalize();
        Ok(())
    }

    /// `Quantity.RoundUp(-3)`: rounds up (away from zero) to milli-units;
    /// the given text is lost only if the value changes.
    pub(super) fn round_up_milli(&mut self) {
        if self.mantissa == 0 || self.exponent >= -3 {
            return;
        }
        let shift = u32::try_from(-3 - i64::from(self.exponent)).unwrap_or(u32::MAX);
        self.mantissa = match pow10(shift) {
            Some(div) => {
                if !self.mantissa.is_multiple_of(div) {
                    self.text = None;
                }
                self.mantissa.div_ceil(div)
            }
            None => {
                self.text = None;
                1
            }
        };
        self.exponent = -3;
        self.normalize();
    }

    /// The text Go writes: the given text if kept, else the canonical form
    /// (`Quantity.CanonicalizeBytes`).
    pub(super) fn to_text(&self) -> String {
        match &self.text {
            Some(text) => text.clone(),
            None => self.canonical(),
        }
    }

    pub(super) fn canonical(&self) -> String {
        if self.mantissa == 0 {
            return "0".to_owned();
        }
        let sign = if self.negative { "-" } else { "" };
        let mut format = self.format;
        if format == Format::BinarySi {
            let small = self.cmp_magnitude(&Qty::integer(1024)) == Ordering::Less;
            // Only whole numbers are written in binary units.
            let whole = self.exponent >= 0;
            if small || !whole {
                format = Format::DecimalSi;
            } else if let Some(value) = u32::try_from(self.exponent)
                .ok()
                .and_then(pow10)
                .and_then(|f| self.mantissa.checked_mul(f))
            {
                let mut value = value;
                let mut power = 0;
                while value.is_multiple_of(1024) {
                    value /= 1024;
                    power += 1;
                }
                let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].get(power);
                if let Some(suffix) = suffix {
                    return format!("{sign}{value}{suffix}");
                }
                format = Format::DecimalSi;
            } else {
                format = Format::DecimalSi;
            }
        }
        // Decimal: the largest exponent that is a multiple of three and
        // leaves a whole mantissa.
        let shift = self.exponent.rem_euclid(3);
        let Some(mantissa) = pow10(shift.unsigned_abs()).and_then(|f| self.mantissa.checked_mul(f))
        else {
            // Beyond 128 bits (Go would use a big integer): written as an
            // exponent, the value unchanged.
            return format!("{sign}{}e{}", self.mantissa, self.exponent);
        };
        let exponent = self.exponent - shift;
        let suffix = match (format, exponent) {
            (Format::DecimalExponent, 0) => String::new(),
            (Format::DecimalExponent, e) => format!("e{e}"),
            (_, -9) => "n".to_owned(),
            (_, -6) => "u".to_owned(),
            (_, -3) => "m".to_owned(),
            (_, 0) => String::new(),
            (_, 3) => "k".to_owned(),
            (_, 6) => "M".to_owned(),
            (_, 9) => "G".to_owned(),
            (_, 12) => "T".to_owned(),
            (_, 15) => "P".to_owned(),
            (_, 18) => "E".to_owned(),
            // Go has no suffix here (and would drop the exponent); written
            // as an exponent so the value stays right.
            (_, e) => format!("e{e}"),
        };
        format!("{sign}{mantissa}{suffix}")
    }
}
