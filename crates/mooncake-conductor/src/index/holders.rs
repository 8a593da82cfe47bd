//! The holders of one block: which subscriptions hold it, on which media.
//! Nearly every block has one holder, so that case stays inline.

use super::SubId;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Holder {
    pub sub: SubId,
    /// `Medium::bit`s held.
    pub media: u8,
    /// The media whose copy predates an unrecovered gap in the publisher's
    /// events (a subset of `media`).
    pub stale: u8,
}

#[derive(Clone, Debug, Default)]
pub(super) enum Holders {
    #[default]
    Empty,
    One(Holder),
    Many(Vec<Holder>),
}

impl Holders {
    pub fn iter(&self) -> std::slice::Iter<'_, Holder> {
        match self {
            Holders::Empty => [].iter(),
            Holders::One(h) => std::slice::from_ref(h).iter(),
            Holders::Many(v) => v.iter(),
        }
    }

    pub fn get_mut(&mut self, sub: SubId) -> Option<&mut Holder> {
        match self {
            Holders::Empty => None,
            Holders::One(h) => (h.sub == sub).then_some(h),
            Holders::Many(v) => v.iter_mut().find(|h| h.sub == sub),
        }
    }

    pub fn push(&mut self, h: Holder) {
        *self = match std::mem::take(self) {
            Holders::Empty => Holders::One(h),
            Holders::One(first) => Holders::Many(vec![first, h]),
            Holders::Many(mut v) => {
                v.push(h);
                Holders::Many(v)
            }
        };
    }

    pub fn remove(&mut self, sub: SubId) {
        *self = match std::mem::take(self) {
            Holders::One(h) if h.sub == sub => Holders::Empty,
            Holders::Many(mut v) => {
                v.retain(|h| h.sub != sub);
                match v.len() {
                    0 => Holders::Empty,
                    1 => Holders::One(v[0]),
                    _ => Holders::Many(v),
                }
            }
            other => other,
        };
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Holders::Empty)
    }

    pub fn heap_bytes(&self) -> usize {
        match self {
            Holders::Many(v) => v.capacity() * std::mem::size_of::<Holder>(),
            _ => 0,
        }
    }
}
